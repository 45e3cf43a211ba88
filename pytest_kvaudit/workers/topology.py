"""Where one process sits in a run: an xdist worker, a runner's shard, a merge. Plain data, cheap to import
(the pytest side builds it at configure time, before anything heavy loads)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kvaudit.workers.stop import StopFlag


@dataclass
class Topology:
    """Where this process sits in the run."""

    #: (index, count, folder) on an xdist worker (index -1: a controller's placeholder); None otherwise
    worker: tuple[int, int, Path] | None = None
    #: ``--kvaudit-shard=I/N``: this runner computes shard I of N and writes it to ``partials``
    shard: tuple[int, int] | None = None
    partials: Path | None = None
    #: ``--kvaudit-merge``: judge the partials under this folder, computing nothing
    merge: Path | None = None
    stop: StopFlag | None = None
