"""The syrupy extension that keeps ledgers under the top-level ``snapshots/<model-slug>/``.

One JSON file per test (``snapshots/<slug>/<test module>/<test name>.json``), written atomically
(temporary file + rename) so an interrupted ``--snapshot-update`` leaves the previous ledger whole.
The comparison is :func:`pytest_kvaudit.core.cost.ledger.matches`: the whole document, or only its token-level
fields in a cross-machine audit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from syrupy.extensions.json import JSONSnapshotExtension

from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.cost import ledger


class LedgerExtension(JSONSnapshotExtension):
    """Subclassed per run by :func:`extension_for` with the run's folder and comparison mode."""

    folder: Path = Path("snapshots", "model")  # the model's folder (:func:`.ledger.snapshot_folder`)
    tokens_only: bool = False

    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        return str(cls.folder / Path(test_location.filepath).stem)

    @classmethod
    def discovery_dirname(cls, *, test_location: Any) -> str:
        return str(cls.folder)

    def serialize(self, data: Any, **kwargs: Any) -> str:
        return ledger.dumps(data)

    def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
        return ledger.matches(str(snapshot_data), str(serialized_data), self.tokens_only)

    @classmethod
    def write_snapshot_collection(cls, *, snapshot_collection: Any, name_order: Any = None) -> None:
        data = next(iter(snapshot_collection)).data
        atomic_write_text(Path(snapshot_collection.location), str(data))

    @classmethod
    def ledger_path(cls, test_location: Any) -> Path:
        name = cls.get_snapshot_name(test_location=test_location, index=0)
        return Path(cls.dirname(test_location=test_location)) / f"{name}.{cls.file_extension}"


def extension_for(folder: Path, tokens_only: bool) -> type[LedgerExtension]:
    return type("KvauditLedger", (LedgerExtension,), {"folder": folder, "tokens_only": tokens_only})
