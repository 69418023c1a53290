"""The launcher's environment, as seen from inside one simulated rank process."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchedRank:
    rank: int
    world_size: int
    session: str
    store_path: str


def launched_rank() -> LaunchedRank | None:
    """This process's rank when started by `python -m iris_core.sim`, else None."""
    if "IRIS_SIM_RANK" not in os.environ:
        return None
    return LaunchedRank(int(os.environ["IRIS_SIM_RANK"]), int(os.environ["IRIS_SIM_WORLD_SIZE"]),
                        os.environ["IRIS_SIM_SESSION"], os.environ["IRIS_SIM_STORE"])
