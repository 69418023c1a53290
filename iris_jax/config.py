"""How iris collectives run: one frozen value, passed per call or to replace_lax_collectives.

    cfg = iris_jax.CollectiveConfig(variant="two_shot", timeout_s=5.0)
    y = iris_jax.psum(x, "i", config=cfg)
    step = iris_jax.replace_lax_collectives(train_step, config=cfg)
    with iris_jax.use_config(cfg): ...     # the default of calls traced inside

The defaults come from the environment variables of docs/settings.md, read once
(`default_config()`); a config is hashable and travels as a parameter of the traced
collective, so jit retraces for a new config and never runs a stale one. Changing an
environment variable after the first call has no effect: pass a config instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping

import jax

from iris_core.collectives.algorithms import ALGORITHMS
from iris_core.flag_protocol import DEFAULT_TIMEOUT_S

VARIANTS = ("auto", *ALGORITHMS)  # "auto": two-shot from `two_shot_from` bytes, else one-shot
_LAUNCH_WARPS = (1, 2, 4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class CollectiveConfig:
    """Algorithm choice, thresholds (bytes per rank), launch geometry and timeout.

    Attributes:
      variant: all-reduce algorithm of psum/pmean ("auto" picks by size; see
        iris_jax.all_reduce for the others).
      timeout_s: how long a kernel waits for a peer before failing with PeerTimeoutError.
      two_shot_from: `auto` all-reduces with two-shot from this size (one-shot below).
      zero_copy_from: inputs of this size that lie on the heap are read in place.
      push_from: the pipelined kinds push into the peers' workspaces from this size.
      stream_from / stream_until: psum, all_gather, psum_scatter and all_to_all stream
        from `stream_from`, and (all but all_gather) up to `stream_until` (0: never).
      stream_senders_percent: share of a streamed call's programs that send.
      chunk_bytes: most bytes per block and chunk (None: what the workspace holds).
      block, programs_per_sm, warps: the kernel's tile (elements), grid and warps
        (None: the platform's default, see iris_jax.collectives.lowering.launch_config).
      stream_programs_per_sm, stream_warps: the same for streamed calls of many tiles.
      scatter_hierarchy_from: a psum over axes that span domains runs as psum_scatter /
        psum / all_gather (iris, XLA, iris) from this size, as psum / psum below it
        (iris_jax.collectives.domains).
      fused_reduce_programs, fused_poll_ns: the fused GEMM ops' programs that pull and reduce
        while the others compute, and the ns a waiting program sleeps between two reads of a
        flag (None: the platform's default; iris_jax.ops).
      gemm_config: the GEMM tile of the fused ops and iris_jax.ops.matmul for 16-bit inputs on
        GPUs, (BM, BN, BK, GROUP_M, num_warps, num_stages) (None: the platform's; for tuning,
        benchmarks/tune_gemm.py; the simulator keeps its own small tile).
    """

    variant: str = "auto"
    timeout_s: float = DEFAULT_TIMEOUT_S
    two_shot_from: int = 1 << 62  # never: two-shot did not beat one-shot at any size on 2 x H200
    zero_copy_from: int = 16 << 20
    push_from: int = 32 << 20
    stream_from: int = 16 << 20
    stream_until: int = 1 << 20
    stream_senders_percent: int = 50
    chunk_bytes: int | None = None
    block: int | None = None
    programs_per_sm: int | None = None
    warps: int | None = None
    stream_programs_per_sm: int | None = None
    stream_warps: int | None = None
    scatter_hierarchy_from: int = 1 << 20
    fused_reduce_programs: int | None = None
    fused_poll_ns: int | None = None
    gemm_config: tuple[int, int, int, int, int, int] | None = None

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown all_reduce variant {self.variant!r}; choose one of {VARIANTS}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")
        if not 0 < self.stream_senders_percent < 100:
            raise ValueError(f"stream_senders_percent must be in (0, 100), got {self.stream_senders_percent}")
        for name in ("two_shot_from", "zero_copy_from", "push_from", "stream_from", "stream_until",
                     "scatter_hierarchy_from"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be a byte count >= 0, got {getattr(self, name)}")
        if self.chunk_bytes is not None and self.chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0 (or None for no cap), got {self.chunk_bytes}")
        if self.block is not None and (self.block < 256 or self.block & (self.block - 1)):
            raise ValueError(f"block must be a power of two >= 256, got {self.block}")
        for name in ("programs_per_sm", "stream_programs_per_sm"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warps", "stream_warps"):
            if getattr(self, name) is not None and getattr(self, name) not in _LAUNCH_WARPS:
                raise ValueError(f"{name} must be one of {_LAUNCH_WARPS}, got {getattr(self, name)}")
        if self.fused_reduce_programs is not None and self.fused_reduce_programs < 0:
            raise ValueError(f"fused_reduce_programs must be >= 0, got {self.fused_reduce_programs}")
        if self.fused_poll_ns is not None and not 0 <= self.fused_poll_ns <= 1_000_000:
            raise ValueError(f"fused_poll_ns must be in [0, 1000000] ns, got {self.fused_poll_ns}")
        if self.gemm_config is not None:
            _check_gemm_config(self.gemm_config)

    def replace(self, **changes) -> CollectiveConfig:
        """A copy with `changes` (validated like the constructor).

        Args:
          **changes: fields and their new values.

        Returns:
          The new config.

        Raises:
          ValueError: a value is out of its range.
        """
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CollectiveConfig:
        """The config that the IRIS_COLLECTIVE_* variables describe (defaults elsewhere).

        Args:
          environ: the variables (default: `os.environ`).

        Returns:
          The config.

        Raises:
          ValueError: a variable does not parse (the message names it and what it expects).
        """
        environ = os.environ if environ is None else environ
        values = {}
        for field, (variable, parse, expected) in _ENVIRONMENT.items():
            setting = environ.get(variable, "")
            if setting:
                try:
                    values[field] = parse(setting)
                except ValueError:
                    raise ValueError(f"{variable}={setting!r}: expected {expected}") from None
        return cls(**values)


def _check_gemm_config(value) -> None:
    expected = "(BM, BN, BK, GROUP_M, num_warps, num_stages): powers of two, warps one of " + str(_LAUNCH_WARPS)
    if not isinstance(value, tuple) or len(value) != 6 or not all(isinstance(v, int) and v > 0 for v in value):
        raise ValueError(f"gemm_config must be a tuple {expected}, got {value!r}")
    BM, BN, BK, GROUP_M, warps, _ = value
    if any(v & (v - 1) for v in (BM, BN, BK)) or warps not in _LAUNCH_WARPS:
        raise ValueError(f"gemm_config must be {expected}, got {value!r}")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


_BYTES = (int, "a byte count")
_ENVIRONMENT = {  # field: (variable, parse, what it expects)
    "variant": ("IRIS_COLLECTIVE_VARIANT", str, "a variant name"),
    "timeout_s": ("IRIS_COLLECTIVE_TIMEOUT", float, "seconds"),
    "two_shot_from": ("IRIS_COLLECTIVE_TWO_SHOT_FROM", *_BYTES),
    "zero_copy_from": ("IRIS_COLLECTIVE_ZERO_COPY_FROM", *_BYTES),
    "push_from": ("IRIS_COLLECTIVE_PUSH_FROM", *_BYTES),
    "stream_from": ("IRIS_COLLECTIVE_STREAM_FROM", *_BYTES),
    "stream_until": ("IRIS_COLLECTIVE_STREAM_UNTIL", *_BYTES),
    "stream_senders_percent": ("IRIS_COLLECTIVE_STREAM_SENDERS", int, "a percentage"),
    "chunk_bytes": ("IRIS_COLLECTIVE_CHUNK_BYTES", *_BYTES),
    "block": ("IRIS_COLLECTIVE_BLOCK", int, "elements"),
    "programs_per_sm": ("IRIS_COLLECTIVE_PROGRAMS_PER_SM", int, "an integer"),
    "warps": ("IRIS_COLLECTIVE_WARPS", int, "an integer"),
    "stream_programs_per_sm": ("IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM", int, "an integer"),
    "stream_warps": ("IRIS_COLLECTIVE_STREAM_WARPS", int, "an integer"),
    "scatter_hierarchy_from": ("IRIS_COLLECTIVE_SCATTER_HIERARCHY_FROM", *_BYTES),
    "fused_reduce_programs": ("IRIS_FUSED_REDUCE_PROGRAMS", int, "an integer"),
    "fused_poll_ns": ("IRIS_FUSED_POLL_NS", int, "nanoseconds"),
    "gemm_config": ("IRIS_GEMM_CONFIG", _ints, "BM,BN,BK,GROUP_M,warps,stages"),
}


# part of jit's cache key: a function traced under one config is retraced under another
_scoped = jax.make_user_context(default_value=None)


@functools.cache
def _from_environment() -> CollectiveConfig:
    return CollectiveConfig.from_env()


def default_config() -> CollectiveConfig:
    """The config of calls that pass none.

    Returns:
      `use_config`'s inside its block, else the environment's as it was at the first
      collective (`CollectiveConfig.from_env`).
    """
    return _scoped.value or _from_environment()


@contextlib.contextmanager
def use_config(config: CollectiveConfig) -> Iterator[CollectiveConfig]:
    """Collectives that pass no config use `config` inside the block (jit retraces for it).

    Args:
      config: the default of the calls traced inside the block.

    Yields:
      `config`.

    Raises:
      TypeError: `config` is not a CollectiveConfig.
    """
    if not isinstance(config, CollectiveConfig):
        raise TypeError(f"use_config takes a CollectiveConfig, not {type(config).__name__}")
    with _scoped(config):
        yield config
