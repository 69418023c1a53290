"""`@pytest.mark.iris(...)`: its arguments, checked before a test runs, and what a test gets."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

DEFAULT_TIMEOUT_S = 30.0  # a simulated rank waiting longer fails its test, named (PeerTimeoutError)
RANK_BYTES = 256 << 20  # what a simulated rank's process holds at least (JAX, Triton's interpreter, its heap)
MAX_RANKS = 64

MARKER = ("iris(ranks=2, *, processes=False, detect_races=True, timeout_s=30, heap_size=None): run the test "
          "with an iris runtime of `ranks` simulated ranks (a tuple: once per size), started for it; "
          "`processes=True`: one process per rank; race detection on unless detect_races=False; a rank "
          "waiting longer than timeout_s fails the test (pytest-iris, docs/testing-your-code.md)")


class MarkerError(ValueError):
    """A marker whose arguments cannot be honoured (raised at collection, naming the test)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """One world of a marked test (a tuple of ranks gives one per size)."""

    ranks: int
    processes: bool = False
    detect_races: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    heap_size: int | None = None


@dataclasses.dataclass(frozen=True)
class IrisWorld:
    """What the `iris_world` fixture hands a marked test.

    Attributes:
      runtime: the iris runtime (`iris_jax.runtime()`), started for this test.
      mesh: a 1-D `jax.sharding.Mesh` over the ranks, axis name `axis`; mesh position == rank.
      size: the number of ranks.
      axis: the mesh's axis name, "i".
      settings: the marker's settings.
    """

    runtime: Any
    mesh: Any
    size: int
    axis: str
    settings: Settings

    @property
    def devices(self) -> list:
        return list(self.mesh.devices.flat)


def host_ranks() -> int:
    """The most simulated ranks this host holds: RANK_BYTES of memory each, at most MAX_RANKS."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on Linux: no bound but MAX_RANKS
        return MAX_RANKS
    return max(1, min(MAX_RANKS, memory // RANK_BYTES))


def from_marker(args: Sequence[Any], kwargs: dict[str, Any], where: str) -> list[Settings]:
    """The worlds `@pytest.mark.iris(*args, **kwargs)` asks for, one per world size; raises
    MarkerError naming `where` (the test) and what to change."""
    if len(args) > 1:
        raise MarkerError(f"{where}: @pytest.mark.iris takes one positional argument (ranks), got {len(args)}")
    if args and "ranks" in kwargs:
        raise MarkerError(f"{where}: @pytest.mark.iris got ranks twice (positional and keyword)")
    options = dict(kwargs)
    ranks = args[0] if args else options.pop("ranks", 2)
    unknown = set(options) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise MarkerError(f"{where}: @pytest.mark.iris has no argument {', '.join(sorted(unknown))}; "
                          f"it takes ranks, processes, detect_races, timeout_s, heap_size")
    sizes = list(ranks) if isinstance(ranks, (tuple, list)) else [ranks]
    limit = host_ranks()
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise MarkerError(f"{where}: @pytest.mark.iris(ranks={ranks!r}): a world size is a positive int, "
                              f"got {n!r}")
        if n > limit:
            raise MarkerError(f"{where}: @pytest.mark.iris(ranks={ranks!r}): {n} simulated ranks need about "
                              f"{n * RANK_BYTES >> 20} MiB, more than this host holds (at most {limit} ranks here)")
    if not sizes or len(set(sizes)) != len(sizes):
        raise MarkerError(f"{where}: @pytest.mark.iris(ranks={ranks!r}): give each world size once")
    timeout = options.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise MarkerError(f"{where}: @pytest.mark.iris(timeout_s={timeout!r}): a positive number of seconds")
    for flag in ("processes", "detect_races"):
        if not isinstance(options.get(flag, False), bool):
            raise MarkerError(f"{where}: @pytest.mark.iris({flag}={options[flag]!r}): True or False")
    heap = options.get("heap_size")
    if heap is not None and (isinstance(heap, bool) or not isinstance(heap, int) or heap <= 0):
        raise MarkerError(f"{where}: @pytest.mark.iris(heap_size={heap!r}): a positive number of bytes, or None")
    return [Settings(ranks=n, **options) for n in sizes]
