"""Whole-array collective kernels on the symmetric heap (device code, framework-neutral)."""

from iris_core.collectives.kernels import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BROADCAST,
    PPERMUTE,
    REDUCE_SCATTER,
    collective_kernel,
)
from iris_core.collectives.workspace import WorkspaceLayout

__all__ = ["ALL_GATHER", "ALL_REDUCE", "ALL_TO_ALL", "BROADCAST", "PPERMUTE", "REDUCE_SCATTER",
           "WorkspaceLayout", "collective_kernel"]
