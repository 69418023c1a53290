"""Drop-in replacements for JAX's collectives, on the symmetric heap.

Inside `jax.shard_map`, `iris_jax.psum(x, "i")` returns what `lax.psum(x, "i")` returns.
Every call runs one persistent Triton kernel (iris_core.collectives.kernels): below
PUSH_FROM_BYTES (32 MiB per rank) the input is staged into a fixed heap workspace (or, from
16 MiB, read in place when it already lies on the heap), peers are signalled through flags
with epochs, and each rank pulls what it needs from its peers; from PUSH_FROM_BYTES each rank
stores what its peers need straight into their workspaces and reads its own (push: no staging
copy, and stores move more than loads when both directions are busy). Calls of the kinds
where every rank sends to every other (psum one-shot, all_gather, psum_scatter, all_to_all)
that fit the streamed buffers in one chunk (64 MiB per rank with 2 ranks) stream instead,
from STREAM_FROM_BYTES (16 MiB) and up to STREAM_UNTIL_BYTES (1 MiB; not all_gather): half
the programs push tiles and flag each one, the other half make the output from the tiles as
they arrive.
`axis_name` may be any mesh axis or a tuple of axes, as in lax.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import tree_util

from iris_core.collectives import kernels as K
from iris_core.collectives.workspace import MAX_PROGRAMS
from iris_jax import _runtime as runtime_lib
from iris_jax.call import triton_call
from iris_jax.call import vary as _pvary
from iris_jax.call import varying_axes as _vma
from iris_jax.workspace import workspaces

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)
VARIANTS = ("auto", "one_shot", "two_shot", "ring", "atomic", "spinlock")
_OPS = {"sum": K.SUM, "max": K.MAX, "min": K.MIN}
DEFAULT_TIMEOUT_S = float(os.environ.get("IRIS_COLLECTIVE_TIMEOUT", "60"))
# `auto` uses two-shot from this many bytes per rank. On 2 x H200 two-shot was never faster
# than one-shot from 1 KiB to 256 MiB (2026-11-30, benchmarks/RESULTS.md), so auto stays
# one-shot; with more ranks two-shot reads (W - 1) / W less per rank and should win for
# large arrays (to be measured: 4 and 8 GPUs were not lent yet).
TWO_SHOT_FROM_BYTES = 1 << 62
# Inputs of at least this many bytes that lie on the heap are read in place (zero-copy, no
# staging). Every call of that size then ends with one more flag round (so no rank's input
# changes while a peer still reads it), also when its input was staged: at 16 MiB staging
# costs ~8 us of HBM time per call and the round ~2 us (to be confirmed on the GPU machine).
ZERO_COPY_FROM_BYTES = 16 << 20
# The pipelined kinds push (each rank stores into its receivers' buffers, see
# iris_core.collectives.kernels) from this many bytes of input per rank, and pull below.
# IRIS_COLLECTIVE_PUSH_FROM overrides it (bytes), for tuning and tests.
PUSH_FROM_BYTES = 32 << 20  # run 28: push won every op at 256 MiB (1.07-1.14x pull), was even at 16 MiB
# Streamed push (one chunk, senders and receivers on their own programs, a flag per tile) from
# this many bytes per rank, when the call fits one chunk of the streamed buffers (by default
# 64 MiB per rank with 2 ranks, 21 MiB with 4; IRIS_STREAM_BYTES sizes them);
# IRIS_COLLECTIVE_STREAM_FROM overrides. RESULTS runs 36-37: at 16 MiB 1.06-1.15x
# faster than the default path for every kind it covers (psum 71.4 -> 64.8 us, 1.30x lax);
# at 4 MiB 3 us slower for psum and all_gather (fewer tiles than programs), even below. Run 38
# (IRIS_WORKSPACE_BYTES = 128 MiB) and run 42 (the default buffers): at 64 MiB 1.04-1.09x
# faster than pushing in chunks (psum 1.25x lax).
STREAM_FROM_BYTES = 16 << 20
# Small calls stream too, up to this many bytes per rank, except all_gather (RESULTS runs 36
# and 40: streamed psum and psum_scatter 0.4-1.7 us faster at 16 KiB-1 MiB, all_to_all
# 0.2-0.4; all_gather 0.3-0.5 us slower; psum 3 us slower at 4 MiB). IRIS_COLLECTIVE_STREAM_UNTIL
# overrides (0: never).
STREAM_UNTIL_BYTES = 1 << 20
# Share of a streamed call's programs that send (run 37: 50% beat 25% and 75% at 4 and 16 MiB)
STREAM_SENDERS_PERCENT = 50
# GPU launch configuration (see launch_config): the best geometric mean of 8 configurations
# over psum 64 KiB/16 MiB/256 MiB and ppermute 64 MiB (benchmarks/tune_collectives.py, RESULTS run 13)
DEFAULT_BLOCK, DEFAULT_PROGRAMS_PER_SM, DEFAULT_WARPS = 8192, 1, 8
# Streamed calls of more tiles than half the SMs: two programs per SM (RESULTS runs 44-45:
# 2-4% faster than one at 16-64 MiB, 4 and 8 warps alike; 4 warps were 0.3 us slower than 8
# for calls of one round of tiles, <= 1 MiB, which keep the default)
DEFAULT_STREAM_PROGRAMS_PER_SM, DEFAULT_STREAM_WARPS = 2, 4


def _axes(axis_name) -> tuple[str, ...]:
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    mesh = jax.sharding.get_abstract_mesh()
    names = tuple(mesh.axis_names) if mesh is not None and not mesh.empty else ()
    for a in axes:
        if a not in names:
            raise NameError(f"unbound axis name: {a!r}; iris collectives run inside jax.shard_map over a mesh "
                            f"with that axis (mesh axes here: {names})")
    return axes


def _group_size(axes) -> int:
    mesh = jax.sharding.get_abstract_mesh()
    return math.prod(mesh.shape[a] for a in axes)


def _check_split(what: str, size: int, G: int, tiled: bool) -> None:
    """The dimension split across the group: divisible by G (tiled) or exactly G (untiled)."""
    if tiled and size % G:
        raise ValueError(f"{what} of size {size} is not divisible by the axis size {G}")
    if not tiled and size != G:
        raise ValueError(f"{what} has size {size}, must equal the axis size {G} (or pass tiled=True)")


def _check_dtype(x, what):
    if x.dtype not in [jnp.dtype(d) for d in SUPPORTED_DTYPES]:
        raise TypeError(f"iris_jax.{what}: unsupported dtype {x.dtype}; supported: "
                        f"{', '.join(jnp.dtype(d).name for d in SUPPORTED_DTYPES)}")


def launch_config(rt, streamed: bool = False) -> tuple[int, int, int]:
    """(elements per tile, most programs, warps per program) of the collective kernel.

    Every program of the persistent grid must be resident at once (they wait on their
    peers' twins), so programs stay within `programs_per_sm` x SMs and MAX_PROGRAMS.
    Streamed calls of more tiles than half the programs (`streamed`) run two programs of
    4 warps per SM: two always fit an SM's registers (at most 255 per thread), and each SM
    then both sends and receives.
    Environment overrides, for tuning (benchmarks/tune_collectives.py): IRIS_COLLECTIVE_BLOCK,
    IRIS_COLLECTIVE_PROGRAMS_PER_SM and IRIS_COLLECTIVE_WARPS, and for streamed calls
    IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM and IRIS_COLLECTIVE_STREAM_WARPS.
    """
    if rt.mode.startswith("sim"):
        return 256, 2, 4
    env = os.environ.get
    knob = "IRIS_COLLECTIVE_STREAM_" if streamed else "IRIS_COLLECTIVE_"
    block = int(env("IRIS_COLLECTIVE_BLOCK", DEFAULT_BLOCK))
    per_sm = int(env(knob + "PROGRAMS_PER_SM", DEFAULT_STREAM_PROGRAMS_PER_SM if streamed else DEFAULT_PROGRAMS_PER_SM))
    warps = int(env(knob + "WARPS", DEFAULT_STREAM_WARPS if streamed else DEFAULT_WARPS))
    if block < 256 or block & (block - 1) or per_sm < 1 or warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"bad collective launch config: block={block} (a power of two >= 256), "
                         f"programs per SM={per_sm} (>= 1), warps={warps} (a power of two <= 32)")
    sms = getattr(rt.devices[0], "core_count", None) or 132
    return block, min(per_sm * sms, MAX_PROGRAMS), warps


def _launch(kind: int, x2d, axes, out_blocks: int, *, op=K.SUM, variant=K.ONE_SHOT, sources=None,
            out_invariant=False, what="collective", timeout_s=None):
    """Runs the collective kernel on x viewed as [XB, m]; returns the output as [OB, m]."""
    rt = runtime_lib.runtime()
    ws = workspaces(rt)
    G = _group_size(axes)
    XB, m = x2d.shape
    itemsize = x2d.dtype.itemsize
    block, max_programs, num_warps = launch_config(rt)
    nbytes = XB * m * itemsize

    def chunk_of(buffer_bytes, slots):  # a buffer holds a slot per sender (push) or my input blocks (pull)
        return max(block, min(buffer_bytes // slots, _chunk_cap()) // itemsize // block * block)

    senders_per_buffer = max(G - 1, 1)  # push: every member but the buffer's owner
    stream = _stream(kind, variant, nbytes, G) and m <= chunk_of(ws.layout.stream_capacity, senders_per_buffer)
    push = stream or _push(kind, variant, nbytes)
    chunk = chunk_of(ws.layout.stream_capacity if stream else ws.layout.data_bytes,
                     senders_per_buffer if push else XB)
    tiles = math.ceil(min(m, chunk) / block)
    if stream and tiles > max_programs // 2:  # more than a round of tiles: the streamed launch configuration
        _, max_programs, num_warps = launch_config(rt, streamed=True)
    senders, programs = 1, min(tiles, max_programs)
    if stream:
        senders, receivers = _stream_programs(tiles, max_programs)
        programs = senders + receivers
    acc = "fp32" if jnp.issubdtype(x2d.dtype, jnp.floating) else "int32"
    import triton.language as tl

    out = triton_call(
        x2d, m, kernel=K.collective_kernel, out_shape=jax.ShapeDtypeStruct((out_blocks, m), x2d.dtype),
        grid=(programs,), num_warps=num_warps, group_axes=axes,
        out_varying=tuple(a for a in _vma(x2d) | set(axes) if not (out_invariant and a in axes)),
        KIND=kind, OP=op, VARIANT=variant, G=G, WORLD=rt.world_size, XB=XB, OB=out_blocks,
        SOURCES=tuple(sources) if sources is not None else tuple([-1] * G),
        ACC=tl.float32 if acc == "fp32" else tl.int32, BLOCK=block, CHUNK=chunk,
        DATA=ws.layout.data, DATA2=ws.layout.data2, DATA_BYTES=ws.layout.data_bytes,
        MAX_PROGRAMS=MAX_PROGRAMS, TIMEOUT_NS=int((timeout_s or DEFAULT_TIMEOUT_S) * 1e9), WHAT=what,
        ZERO_COPY=not push and _zero_copy(kind, variant, nbytes), HEAP_BYTES=rt.heap_size,
        VEC=16 // itemsize if m % (16 // itemsize) == 0 else 1, TRACING=rt.tracing.enabled, PUSH=push,
        STREAM=stream, STREAM_AT=ws.layout.stream, STREAM_BYTES=ws.layout.stream_capacity, SENDERS=senders)
    return out


def _zero_copy(kind: int, variant: int, nbytes: int) -> bool:
    """Whether inputs on the heap are read in place (the pulling algorithms, large arrays)."""
    pulls = kind != K.ALL_REDUCE or variant in (K.ONE_SHOT, K.TWO_SHOT)
    return pulls and nbytes >= ZERO_COPY_FROM_BYTES


def _env_bytes(name: str, default: int) -> int:
    """A byte count from the environment (read when a call is traced), else `default`."""
    setting = os.environ.get(name, "")
    try:
        return int(setting) if setting else default
    except ValueError:
        raise ValueError(f"{name}={setting!r}: expected a byte count") from None


def _chunk_cap() -> int:
    """Most bytes per block and chunk: the workspace's share unless IRIS_COLLECTIVE_CHUNK_BYTES
    says less. Smaller chunks overlap more of sending chunk c + 1 with receiving chunk c, at a
    flag round per chunk (a tuning knob: mid-size arrays are one or two chunks by default)."""
    return _env_bytes("IRIS_COLLECTIVE_CHUNK_BYTES", 1 << 62)


def _stream(kind: int, variant: int, nbytes: int, G: int) -> bool:
    """Whether the call may stream (iris_core.collectives.kernels._streamed; it does if it
    fits one chunk of the streamed buffers, IRIS_STREAM_BYTES): a kind in which every member
    sends to every other, G >= 2, and at least STREAM_FROM_BYTES per rank
    (IRIS_COLLECTIVE_STREAM_FROM overrides) or, but for all_gather, at most
    STREAM_UNTIL_BYTES (IRIS_COLLECTIVE_STREAM_UNTIL overrides)."""
    every_pair = kind in (K.ALL_GATHER, K.REDUCE_SCATTER, K.ALL_TO_ALL) or (
        kind == K.ALL_REDUCE and variant == K.ONE_SHOT)
    large = nbytes >= _env_bytes("IRIS_COLLECTIVE_STREAM_FROM", STREAM_FROM_BYTES)
    small = kind != K.ALL_GATHER and nbytes <= _env_bytes("IRIS_COLLECTIVE_STREAM_UNTIL", STREAM_UNTIL_BYTES)
    return every_pair and G > 1 and (large or small)


def _stream_programs(tiles: int, max_programs: int) -> tuple[int, int]:
    """(senders, receivers) of a streamed call of `tiles` tiles: STREAM_SENDERS_PERCENT of
    the programs send (IRIS_COLLECTIVE_STREAM_SENDERS overrides), the others receive, at
    least one each. Each side takes tiles in rounds (program p: tiles p, p + n, ...), and
    its program count n is the fewest that needs as few rounds as the most programs would,
    which fills the last round best: 2048 tiles over 66 senders are 31 full rounds and a
    last one of 2 tiles, which then cross the link at one SM's rate; over 64, 32 full rounds.
    """
    percent = int(os.environ.get("IRIS_COLLECTIVE_STREAM_SENDERS", STREAM_SENDERS_PERCENT))
    most_senders = min(max(max_programs * percent // 100, 1), max_programs - 1)

    def balanced(most):
        return math.ceil(tiles / math.ceil(tiles / most))

    return balanced(most_senders), balanced(max_programs - most_senders)


def _push(kind: int, variant: int, nbytes: int) -> bool:
    """Whether the call pushes (the pipelined kinds, from PUSH_FROM_BYTES; 0: always)."""
    pipelined = kind != K.ALL_REDUCE or variant == K.ONE_SHOT
    return pipelined and nbytes >= _env_bytes("IRIS_COLLECTIVE_PUSH_FROM", PUSH_FROM_BYTES)


# -- all-reduce family ------------------------------------------------------------------------
def _choose_variant(variant: str, nbytes: int, group_size: int) -> int:
    if variant not in VARIANTS:
        raise ValueError(f"unknown all_reduce variant {variant!r}; choose one of {VARIANTS}")
    if variant == "auto":
        return K.TWO_SHOT if nbytes >= TWO_SHOT_FROM_BYTES and group_size > 1 else K.ONE_SHOT
    return {"one_shot": K.ONE_SHOT, "two_shot": K.TWO_SHOT, "ring": K.RING, "atomic": K.ATOMIC,
            "spinlock": K.SPINLOCK}[variant]


def _all_reduce_leaf(x, axes, op: str, variant: str, timeout_s):
    _check_dtype(x, "all_reduce")
    if op not in _OPS:
        raise ValueError(f"unknown reduction {op!r}; choose one of {tuple(_OPS)}")
    group_size = _group_size(axes)
    chosen = _choose_variant(variant, x.size * x.dtype.itemsize, group_size)
    if chosen in (K.ATOMIC, K.SPINLOCK) and op != "sum":
        raise ValueError(f"all_reduce variant {variant!r} only sums; use one_shot, two_shot or ring for op={op!r}")
    if chosen == K.ATOMIC and x.dtype not in (jnp.float32, jnp.int32):
        raise TypeError(f"all_reduce variant 'atomic' needs float32 or int32 (got {x.dtype}); use 'spinlock' "
                        "or another variant")
    if chosen == K.RING and group_size > 32:
        raise ValueError(f"all_reduce variant 'ring' supports groups of up to 32 ranks (got {group_size})")
    if chosen == K.RING and group_size == 1:
        chosen = K.ONE_SHOT  # a ring of one: nothing to pass around
    if x.size == 0:
        return _empty(x.shape, x.dtype, _vma(x) - set(axes))
    out = _launch(K.ALL_REDUCE, x.reshape(1, -1), axes, 1, op=_OPS[op], variant=chosen, out_invariant=True,
                  what=f"all_reduce({op})", timeout_s=timeout_s)
    return out.reshape(x.shape)


def all_reduce(x, axis_name, op: str = "sum", variant: str = "auto", *, timeout_s: float | None = None):
    """Reduces `x` (a pytree) over `axis_name` with `op` ("sum", "max", "min").

    Args:
      variant: "one_shot" (every rank reads every peer's input), "two_shot" (reduce-scatter
        then all-gather), "ring" (2(G-1) neighbour steps), "atomic" (remote atomic adds into
        every rank's accumulator; float32/int32 sums), "spinlock" (read-add-write under a
        per-tile lock on every rank; sums), or "auto" (by size, from measured thresholds).
      timeout_s: how long to wait for a peer before failing (default IRIS_COLLECTIVE_TIMEOUT or 60).

    Inputs are staged into the group's heap workspace; an input of ZERO_COPY_FROM_BYTES or more
    that already lies on the heap (made by iris_jax and passed straight into the jitted
    function) is read in place instead (every variant but ring, atomic and spinlock; the same
    holds for the other collectives here). From PUSH_FROM_BYTES, one-shot and the other
    collectives push into the peers' workspaces instead (see the module docstring).
    """
    axes = _axes(axis_name)
    return tree_util.tree_map(lambda leaf: _all_reduce_leaf(leaf, axes, op, variant, timeout_s), x)


def psum(x, axis_name, *, variant: str = "auto"):
    """Like `lax.psum`: the sum of `x` (a pytree) over `axis_name`."""
    axes = _axes(axis_name)
    return tree_util.tree_map(lambda leaf: _psum(leaf, axes, variant), x)


def _psum(x, axes, variant):
    def transpose(ct):
        # lax.psum's transpose: with varying-axes checks, a (free) cast back to varying;
        # without them, another psum.
        return _pvary(ct, axes) if _check_vma() else _all_reduce_leaf(ct, axes, "sum", variant, None)

    return _linear(lambda v: _all_reduce_leaf(v, axes, "sum", variant, None), transpose)(x)


def _linear(forward, transpose):
    """`forward` as a differentiable op whose cotangent rule is `transpose` (linear ops)."""

    @jax.custom_vjp
    def f(v):
        return forward(v)

    f.defvjp(lambda v: (f(v), None), lambda _, ct: (transpose(ct),))
    return f


def _check_vma() -> bool:
    from jax._src import config

    return bool(config._check_vma.value)


def _empty(shape, dtype, varying):
    """The result of a collective on a zero-size input (no kernel runs), typed like the
    kernel's output: varying over exactly `varying`, as lax's result is."""
    return _pvary(jnp.zeros(shape, dtype), tuple(sorted(varying)))


def pmax(x, axis_name):
    """Like `lax.pmax`."""
    return all_reduce(x, axis_name, op="max", variant="one_shot")


def pmin(x, axis_name):
    """Like `lax.pmin`."""
    return all_reduce(x, axis_name, op="min", variant="one_shot")


# -- gather / scatter / permute ---------------------------------------------------------------
def _all_gather_leaf(x, axes, axis: int, tiled: bool):
    _check_dtype(x, "all_gather")
    G = _group_size(axes)
    axis = axis % (x.ndim + (0 if tiled else 1)) if x.ndim or not tiled else 0
    if x.size == 0:
        out = _empty((G, *x.shape), x.dtype, _vma(x) | set(axes))
    else:
        out = _launch(K.ALL_GATHER, x.reshape(1, -1), axes, G, what="all_gather").reshape(G, *x.shape)
    if tiled:
        out = jnp.moveaxis(out, 0, axis)
        return out.reshape(*x.shape[:axis], G * x.shape[axis], *x.shape[axis + 1:])
    return jnp.moveaxis(out, 0, axis)


def all_gather(x, axis_name, *, axis: int = 0, tiled: bool = False):
    """Like `lax.all_gather`."""
    axes = _axes(axis_name)
    op = _linear(lambda v: _all_gather_leaf(v, axes, axis, tiled), lambda ct: _psum_scatter_leaf(ct, axes, axis, tiled))
    return tree_util.tree_map(op, x)


def _psum_scatter_leaf(x, axes, scatter_dimension: int, tiled: bool):
    _check_dtype(x, "psum_scatter")
    G = _group_size(axes)
    d = scatter_dimension % x.ndim
    size = x.shape[d]
    _check_split(f"psum_scatter: dimension {d}", size, G, tiled)
    moved = jnp.moveaxis(x, d, 0)
    block_shape = (size // G, *moved.shape[1:]) if tiled else moved.shape[1:]
    if x.size == 0:
        out = _empty(block_shape, x.dtype, _vma(x) | set(axes))
    else:
        out = _launch(K.REDUCE_SCATTER, moved.reshape(G, -1), axes, 1, what="psum_scatter").reshape(block_shape)
    return jnp.moveaxis(out, 0, d) if tiled else out


def psum_scatter(x, axis_name, *, scatter_dimension: int = 0, tiled: bool = False):
    """Like `lax.psum_scatter`."""
    axes = _axes(axis_name)
    op = _linear(lambda v: _psum_scatter_leaf(v, axes, scatter_dimension, tiled),
                 lambda ct: _all_gather_leaf(ct, axes, scatter_dimension, tiled))
    return tree_util.tree_map(op, x)


def _all_to_all_leaf(x, axes, split_axis: int, concat_axis: int, tiled: bool):
    _check_dtype(x, "all_to_all")
    G = _group_size(axes)
    s, c = split_axis % x.ndim, concat_axis % x.ndim
    size = x.shape[s]
    _check_split(f"all_to_all: split dimension {s}", size, G, tiled)
    moved = jnp.moveaxis(x, s, 0)  # [size, ...rest]
    chunk = moved.reshape(G, size // G, *moved.shape[1:])  # chunk i goes to member i
    if x.size == 0:
        received = _pvary(chunk, axes)
    else:
        received = _launch(K.ALL_TO_ALL, chunk.reshape(G, -1), axes, G, what="all_to_all").reshape(chunk.shape)
    # received[i] came from member i; put it back where the split dim was, then concatenate
    pieces = jnp.moveaxis(received, 1, s + 1)  # [G, ...x.shape with size//G at s]
    pieces = pieces.reshape(G, *x.shape[:s], size // G, *x.shape[s + 1:])
    if not tiled:
        pieces = pieces.reshape(G, *x.shape[:s], *x.shape[s + 1:])
        return jnp.moveaxis(pieces, 0, c)
    out = jnp.moveaxis(pieces, 0, c)
    shape = list(pieces.shape[1:])
    shape[c] *= G
    return out.reshape(shape)


def all_to_all(x, axis_name, split_axis: int, concat_axis: int, *, tiled: bool = False):
    """Like `lax.all_to_all`."""
    axes = _axes(axis_name)
    op = _linear(lambda v: _all_to_all_leaf(v, axes, split_axis, concat_axis, tiled),
                 lambda ct: _all_to_all_leaf(ct, axes, concat_axis, split_axis, tiled))
    return tree_util.tree_map(op, x)


def _ppermute_leaf(x, axes, perm):
    _check_dtype(x, "ppermute")
    G = _group_size(axes)
    sources = [-1] * G
    for src, dst in perm:
        if not (0 <= src < G and 0 <= dst < G):
            raise ValueError(f"ppermute: pair ({src}, {dst}) out of range for axis size {G}")
        if sources[dst] != -1:
            raise ValueError(f"ppermute: destination {dst} appears twice in perm {perm}")
        sources[dst] = src
    if len({s for s, _ in perm}) != len(perm):
        raise ValueError(f"ppermute: a source appears twice in perm {perm}")
    if x.size == 0:
        return _pvary(x, axes)
    out = _launch(K.PPERMUTE, x.reshape(1, -1), axes, 1, sources=sources, what="ppermute")
    return out.reshape(x.shape)


def ppermute(x, axis_name, perm: Sequence[tuple[int, int]]):
    """Like `lax.ppermute`: member `dst` receives `src`'s value for each (src, dst); others get zeros."""
    axes = _axes(axis_name)
    perm = tuple((int(s), int(d)) for s, d in perm)
    inverse = tuple((d, s) for s, d in perm)
    op = _linear(lambda v: _ppermute_leaf(v, axes, perm), lambda ct: _ppermute_leaf(ct, axes, inverse))
    return tree_util.tree_map(op, x)


def broadcast(x, axis_name, root: int = 0):
    """Every member of the group gets member `root`'s `x`."""
    axes = _axes(axis_name)

    def leaf(v):
        _check_dtype(v, "broadcast")
        G = _group_size(axes)
        if not 0 <= root < G:
            raise ValueError(f"broadcast: root {root} out of range for axis size {G}")
        if v.size == 0:
            return _empty(v.shape, v.dtype, _vma(v) - set(axes))
        out = _launch(K.BROADCAST, v.reshape(1, -1), axes, 1, sources=[root] * G, out_invariant=True,
                      what="broadcast")
        return out.reshape(v.shape)

    return tree_util.tree_map(leaf, x)
