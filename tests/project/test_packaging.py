"""Every package folder under pytest_kvaudit/ ships in the wheel: pyproject's explicit package list must name it
(a subpackage left out installs fine and fails only on import, in a user's run)."""

from __future__ import annotations

import tomllib

from kvtest import REPO


def test_every_subpackage_is_in_the_wheel() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "pytest_kvaudit").rglob("__init__.py")}
    assert found <= listed, f"missing from pyproject's packages: {sorted(found - listed)}"
