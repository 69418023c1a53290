"""How an iris collective becomes one launch of the collective kernel.

At lowering time (inside the manual mesh of the shard_map), each collective's rule
(iris_jax.collectives.rules) views the operands of an `iris_collective` equation as [blocks, m] matrices
(the layout iris_core.collectives.kernels works on); `launch_many` puts them side by side and
launches the kernel once, and the rule reshapes its output to what lax returns.

Algorithm choice, per call (thresholds are bytes per rank, from the CollectiveConfig):
below `push_from` the input is staged into the group's heap workspace (or, from
`zero_copy_from`, read in place when it already lies on the heap), peers are signalled through
flags with epochs, and each rank pulls what it needs; from `push_from` each rank stores what
its peers need straight into their workspaces (no staging copy; stores move more than loads
when both directions are busy). Calls of the kinds where every rank sends to every other
(psum one-shot, all_gather, psum_scatter, all_to_all) that fit the streamed buffers in one
chunk stream instead, from `stream_from` and (but all_gather) up to `stream_until`: half the
programs push tiles and flag each, the other half build the output as tiles arrive.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from iris_core import flag_protocol
from iris_core.collectives import kernels as K
from iris_core.collectives import kinds
from iris_core.collectives.algorithms import ALGORITHMS, BY_VARIANT
from iris_core.collectives.workspace import MAX_PROGRAMS, STREAM_BYTES_PER_COUNTER
from iris_core.launch import vector_width
from iris_core.platform import GPU, SIMULATOR
from iris_jax import _runtime as runtime_lib
from iris_jax import compat
from iris_jax._runtime.workspace import parse_key, workspaces
from iris_jax.calls.triton_call import triton_call
from iris_jax.calls.triton_call import varying_axes as _vma
from iris_jax.config import CollectiveConfig

# launch defaults: the configuration benchmarks/tune_collectives.py found best over its sizes
# (the tile's elements per backend: iris_jax._runtime.backends)
DEFAULT_PROGRAMS_PER_SM, DEFAULT_WARPS = 1, 8
# streamed calls of more tiles than half the SMs: every SM both sends and receives
DEFAULT_STREAM_PROGRAMS_PER_SM, DEFAULT_STREAM_WARPS = 2, 4
MIN_BLOCK = 256
NO_CHUNK_CAP = 1 << 62  # config.chunk_bytes None: more than any workspace holds, so chunks are what it holds


def group_size(axes, groups=None) -> int:
    """The members of a group over `axes`: their sizes' product, or one group's of `groups`
    (lax's axis_index_groups, equal-sized)."""
    if groups:
        return len(groups[0])
    mesh = jax.sharding.get_abstract_mesh()
    return math.prod(mesh.shape[a] for a in axes)


def lowers_on_iris(ctx, axes: tuple) -> bool:
    """At lowering: GPUs or the simulator, inside a shard_map in which every one of `axes` is
    manual (other axes of the mesh may be automatic: iris_jax.collectives.primitive lowers the kernels in
    a nested region that makes them manual)."""
    from jax._src.sharding_impls import SPMDAxisContext

    axis_context = ctx.module_context.axis_context
    platforms = set(ctx.module_context.platforms)
    return (platforms <= {GPU.jax_platform, SIMULATOR.jax_platform} and isinstance(axis_context, SPMDAxisContext)
            and set(axes) <= set(axis_context.manual_axes))


def group_positions(axes) -> list[int]:
    """The kernel's group numbers the members of a tuple of axes in the tuple's order (like
    lax.axis_index); lax.ppermute did so in the mesh's axis order before jax 0.12. Entry i:
    the kernel's position of lax.ppermute's member i."""
    mesh = jax.sharding.get_abstract_mesh()
    sizes = [mesh.shape[a] for a in axes]
    if compat.ppermute_numbers_in_tuple_order():
        return list(range(math.prod(sizes)))
    in_mesh_order = sorted(range(len(axes)), key=lambda k: list(mesh.axis_names).index(axes[k]))
    positions = [0] * math.prod(sizes)
    for position, coords in enumerate(np.ndindex(*sizes)):  # coords along axes, tuple order
        positions[int(np.ravel_multi_index([coords[k] for k in in_mesh_order],
                                           [sizes[k] for k in in_mesh_order]))] = position
    return positions


def out_of_mesh_order(axes) -> bool:
    """Whether a tuple of axes numbers its members otherwise than the mesh's order would (axes
    of size 1 reorder nothing)."""
    mesh = jax.sharding.get_abstract_mesh()
    sized = [a for a in axes if mesh.shape[a] > 1]
    return sized != sorted(sized, key=list(mesh.axis_names).index)


# -- from lax's parameters to kernel launches (each collective's own step: its rule) ------
def effective_variant(variant: str, op: str, dtype, nbytes: int, G: int, config: CollectiveConfig) -> int:
    """The all-reduce algorithm that runs: `variant`, or one-shot where it cannot run this call
    (iris_core.collectives.algorithms: its ops, dtypes and group sizes); `auto` chooses two-shot
    from `config.two_shot_from` bytes per rank."""
    if variant == "auto":
        return K.TWO_SHOT if nbytes >= config.two_shot_from and G > 1 else K.ONE_SHOT
    algorithm = ALGORITHMS[variant]
    return algorithm.variant if algorithm.runs(op, jnp.dtype(dtype).name, G) else K.ONE_SHOT


def split_chunks(x, s, G):
    """[G, size / G, ...rest]: chunk i goes to member i."""
    moved = jnp.moveaxis(x, s, 0)
    return moved.reshape(G, x.shape[s] // G, *moved.shape[1:])


def concatenated(received, x, s, c, G):
    """received[i] came from member i: put it back where the split dim was, then concatenate.
    (The primitive is always tiled: lax.all_to_all adds and removes the axes of untiled calls.)"""
    size = x.shape[s]
    pieces = jnp.moveaxis(received, 1, s + 1).reshape(G, *x.shape[:s], size // G, *x.shape[s + 1:])
    shape = list(pieces.shape[1:])
    shape[c] *= G
    return jnp.moveaxis(pieces, 0, c).reshape(shape)


def launch_many(kind: int, rows: list, axes, out_blocks: int, config, **kwargs) -> list:
    """Operands side by side ([XB, m1 + m2 + ...]), one launch, the output split back."""
    if len(rows) == 1:
        return [launch(kind, rows[0], axes, out_blocks, config, **kwargs)]
    widths = [r.shape[1] for r in rows]
    out = launch(kind, jnp.concatenate(rows, axis=1), axes, out_blocks, config, **kwargs)
    return jnp.split(out, np.cumsum(widths)[:-1].tolist(), axis=1)


# -- one launch -----------------------------------------------------------------------------
class Launched(NamedTuple):
    """A kernel launch a collective's lowering made: its op (`what`), the group's axes and
    axis_index_groups, and the workspace it uses (the kernel call's key: `workspace_name`)."""
    what: str
    axes: tuple
    groups: tuple | None
    workspace: str


_recorded: contextvars.ContextVar[list | None] = contextvars.ContextVar("iris_launches", default=None)


@contextlib.contextmanager
def recording():
    """Within it, every launch of a communicating kernel appends its Launched to the list it
    yields (what `iris_jax.explain` reports of a traced lowering)."""
    found: list[Launched] = []
    token = _recorded.set(found)
    try:
        yield found
    finally:
        _recorded.reset(token)


def record(launched: Launched) -> None:
    found = _recorded.get()
    if found is not None:
        found.append(launched)


def workspace_name(key: str, rt=None) -> str:
    """A workspace key as `explain` shows it: the part and its size class (a data buffer's
    bytes), "largest" where it is the configured class."""
    part, size = parse_key(key)
    layout = workspaces(rt or runtime_lib.runtime()).layout_of(key)
    return f"{part} {_whole_units(layout.data_bytes)}" + (" (largest)" if size is None else "")


def _whole_units(n: int) -> str:
    """`n` bytes in the largest binary unit that holds it whole (size classes are such sizes)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


class LaunchConfig(NamedTuple):
    """How the collective kernel launches: the largest tile (elements), the most programs of
    its persistent grid, and warps per program."""
    block: int
    programs: int
    warps: int


def launch_config(rt, config: CollectiveConfig, streamed: bool = False) -> LaunchConfig:
    """The collective kernel's LaunchConfig (elements per tile, most programs, warps per program).

    Every program of the persistent grid must be resident at once (they wait on their
    peers' twins), so programs stay within `programs_per_sm` x SMs and MAX_PROGRAMS.
    Streamed calls of more tiles than half the programs (`streamed`) run two programs of
    4 warps per SM: two always fit an SM's registers (at most 255 per thread), and each SM
    then both sends and receives. The backend gives the default tile and the SMs: on the
    simulator large tiles over 2 SMs of 4 warps (backends.SIM_BLOCK); a config's `block` and
    `programs_per_sm` apply there too (small tiles exercise the tiling). The tile shrinks
    further where a workspace slot is smaller (`fitting_block`).
    """
    backend = rt.backend
    block = config.block or backend.collective_block
    if streamed:
        per_sm = config.stream_programs_per_sm or DEFAULT_STREAM_PROGRAMS_PER_SM
        warps = config.stream_warps or DEFAULT_STREAM_WARPS
    else:
        per_sm, warps = config.programs_per_sm or DEFAULT_PROGRAMS_PER_SM, config.warps or DEFAULT_WARPS
    programs = min(per_sm * backend.sm_count(rt.devices), MAX_PROGRAMS)
    return LaunchConfig(block, programs, backend.collective_warps(warps))


def fitting_block(block: int, buffer_bytes: int, slots: int, itemsize: int) -> int:
    """`block`, halved until a tile fits one of a buffer's `slots` (at least MIN_BLOCK), so
    that a chunk (a whole number of tiles) never overruns the buffer."""
    while block > MIN_BLOCK and block * itemsize > buffer_bytes // slots:
        block //= 2
    return block


class LaunchPlan(NamedTuple):
    """How one call of the collective kernel runs: its tile and chunk (elements), whether it
    pushes, streams or reads its input in place, its grid (`programs`, of which `senders`
    send when it streams) and warps, and the workspace class it uses (`layout`, and `workspace`,
    the kernel call's key for it: iris_jax._runtime.workspace)."""
    block: int
    chunk: int
    push: bool
    stream: bool
    zero_copy: bool
    programs: int
    senders: int
    warps: int
    layout: object
    workspace: str


def plan(kind: int, blocks: int, m: int, dtype, G: int, config: CollectiveConfig, *, variant=K.ONE_SHOT,
         rt=None) -> LaunchPlan:
    """The LaunchPlan of the collective kernel on an operand viewed as [blocks, m] of `dtype`
    over a group of G members: what `launch` runs, and what `iris_jax.explain` reports."""
    rt = rt or runtime_lib.runtime()
    ws = workspaces(rt)
    itemsize = jnp.dtype(dtype).itemsize
    accumulator = kinds.accumulator(jnp.dtype(dtype).name)
    # a buffer's elements: the accumulator's where the algorithm keeps partial results there
    slot_itemsize = jnp.dtype(accumulator).itemsize if variant in kinds.KEEPS_PARTIALS else itemsize
    largest_block, max_programs, num_warps = launch_config(rt, config)
    if rt.backend.tile_fits_data:
        largest_block = min(largest_block, max(MIN_BLOCK, 1 << max(m - 1, 0).bit_length()))
    nbytes = blocks * m * itemsize

    def tiling(buffer_bytes, slots):  # a buffer holds a slot per sender (push) or my input blocks (pull)
        block = fitting_block(largest_block, buffer_bytes, slots, slot_itemsize)
        cap = config.chunk_bytes or NO_CHUNK_CAP
        return block, max(block, min(buffer_bytes // slots, cap) // slot_itemsize // block * block)

    senders_per_buffer = max(G - 1, 1)  # push: every member but the buffer's owner
    stream = (streams(kind, variant, nbytes, G, config)
              and m <= tiling(ws.layout.stream_capacity, senders_per_buffer)[1])
    push = stream or pushes(kind, variant, nbytes, config)
    slots = senders_per_buffer if push else blocks
    block, chunk = tiling(ws.layout.stream_capacity if stream else ws.layout.data_bytes, slots)
    layout = ws.layout  # the largest class decided the above; a call of one chunk takes the least that holds it
    if m <= chunk:
        fitted = ws.fitting("collective", one_chunk_bytes(m, block, slots, slot_itemsize, G, stream), streamed=stream)
        fitted_block, fitted_chunk = tiling(fitted.stream_capacity if stream else fitted.data_bytes, slots)
        if (fitted_block, min(fitted_chunk, m)) == (block, m):  # the same tile, still one chunk
            layout, chunk = fitted, fitted_chunk
    tiles = math.ceil(min(m, chunk) / block)
    if stream and tiles > max_programs // 2:  # more than a round of tiles: the streamed launch configuration
        _, max_programs, num_warps = launch_config(rt, config, streamed=True)
    senders, programs = 1, min(tiles, max_programs)
    if stream:
        senders, receivers = stream_programs(tiles, max_programs, config.stream_senders_percent)
        programs = senders + receivers
    return LaunchPlan(block, chunk, push, stream, not push and zero_copy(kind, variant, nbytes, config), programs,
                      senders, num_warps, layout, ws.key("collective", layout))


def launch(kind: int, x2d, axes, out_blocks: int, config: CollectiveConfig, *, op=K.SUM, variant=K.ONE_SHOT,
           sources=None, out_invariant=False, groups=None, what="collective"):
    """Runs the collective kernel on x viewed as [XB, m] as `plan` plans it; returns the output
    as [OB, m]. `groups`: lax's axis_index_groups (the kernel's group is then the device's group
    of them)."""
    import triton.language as tl

    rt = runtime_lib.runtime()
    G = group_size(axes, groups)
    XB, m = x2d.shape
    how = plan(kind, XB, m, x2d.dtype, G, config, variant=variant, rt=rt)
    record(Launched(what, tuple(axes), groups, how.workspace))
    return triton_call(
        x2d, m, kernel=K.collective_kernel, out_shape=jax.ShapeDtypeStruct((out_blocks, m), x2d.dtype),
        grid=(how.programs,), num_warps=how.warps, group_axes=axes, axis_index_groups=groups,
        workspace=how.workspace,
        out_varying=tuple(a for a in _vma(x2d) | set(axes) if not (out_invariant and a in axes)),
        **K.launch_constants(
            KIND=kind, OP=op, VARIANT=variant, G=G, WORLD=rt.world_size, XB=XB, OB=out_blocks,
            SOURCES=tuple(sources) if sources is not None else tuple([-1] * G),
            ACC=getattr(tl, kinds.accumulator(x2d.dtype.name)), BLOCK=how.block, CHUNK=how.chunk,
            REGIONS=how.layout.regions, TIMEOUT_NS=flag_protocol.timeout_ns(config.timeout_s), WHAT=what,
            ZERO_COPY=how.zero_copy, HEAP_BYTES=rt.heap_size, VEC=vector_width(m, x2d.dtype.itemsize),
            TRACING=rt.tracing.enabled, PUSH=how.push, STREAM=how.stream, SENDERS=how.senders))


def one_chunk_bytes(m: int, block: int, slots: int, itemsize: int, G: int, stream: bool) -> int:
    """The buffer that holds a call of m columns in one chunk of tiles of `block`: a slot of
    whole tiles per sender or input block; streamed, also a delivery counter per tile and member
    (iris_core.collectives.workspace)."""
    tiles = math.ceil(m / block)
    need = slots * tiles * block * itemsize
    return max(need, G * tiles * STREAM_BYTES_PER_COUNTER) if stream else need


def zero_copy(kind: int, variant: int, nbytes: int, config: CollectiveConfig) -> bool:
    """Whether inputs on the heap are read in place (the pulling algorithms, large arrays)."""
    pulls = kind != K.ALL_REDUCE or BY_VARIANT[variant].pulls
    return pulls and nbytes >= config.zero_copy_from


def streams(kind: int, variant: int, nbytes: int, G: int, config: CollectiveConfig) -> bool:
    """Whether the call may stream (it does if it also fits one chunk of the streamed
    buffers): a kind in which every member sends to every other, G >= 2, and at least
    `stream_from` bytes per rank or, but for all_gather, at most `stream_until`."""
    every_pair = kinds.every_pair(kind, variant)
    large = nbytes >= config.stream_from
    small = kind != K.ALL_GATHER and nbytes <= config.stream_until
    return every_pair and G > 1 and (large or small)


def stream_programs(tiles: int, max_programs: int, senders_percent: int) -> tuple[int, int]:
    """(senders, receivers) of a streamed call of `tiles` tiles: `senders_percent` of the
    programs send, the others receive, at least one each. Each side takes tiles in rounds
    (program p: tiles p, p + n, ...), and its program count n is the fewest that needs as few
    rounds as the most programs would, which fills the last round best: 2048 tiles over 66
    senders are 31 full rounds and a last one of 2 tiles, which then cross the link at one
    SM's rate; over 64, 32 full rounds.
    """
    most_senders = min(max(max_programs * senders_percent // 100, 1), max_programs - 1)

    def balanced(most):
        return math.ceil(tiles / math.ceil(tiles / most))

    return balanced(most_senders), balanced(max_programs - most_senders)


def pushes(kind: int, variant: int, nbytes: int, config: CollectiveConfig) -> bool:
    """Whether the call pushes (the pipelined kinds, from `push_from` bytes; 0: always)."""
    return kinds.pipelined(kind, variant) and nbytes >= config.push_from
