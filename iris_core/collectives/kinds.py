"""What a collective launch asks for: its kind, how it combines, which all-reduce algorithm.

Plain ints, the kernel's KIND / OP / VARIANT constexprs. Device code names them through this
module (`kinds.ALL_GATHER`; Triton resolves a module's attribute at compile time), and the
predicates below are constexpr functions, so host and device code ask the same question the
same way.

    kind            input blocks  output blocks  member i contributes
    ALL_REDUCE      1             1              all of its input, combined
    ALL_GATHER      1             G              all of its input, as output block i
    REDUCE_SCATTER  G             1              its block `me`, combined
    ALL_TO_ALL      G             G              its block `me`, as output block i
    PPERMUTE        1             1              all of its input, from my source member only
    BROADCAST       1             1              all of its input, from the root only
"""

import triton

# each name's position is its constexpr; the names are what fault records and signatures say
KIND_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ppermute", "broadcast",
              "ragged_all_to_all", "matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul")
(ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, PPERMUTE, BROADCAST, RAGGED_ALL_TO_ALL, MATMUL_ALL_REDUCE,
 MATMUL_REDUCE_SCATTER, ALL_GATHER_MATMUL) = range(len(KIND_NAMES))
# (from RAGGED_ALL_TO_ALL on, other kernels than the collective kernel: signatures only; ragged's is
# iris_core.collectives.ragged, the fused GEMM ops' iris_core.gemm.fused, whose shapes do not fit a
# signature's fields: FUSED_KINDS hash them, see iris_core.faults.shape_field)
FUSED_KINDS = (MATMUL_ALL_REDUCE, MATMUL_REDUCE_SCATTER, ALL_GATHER_MATMUL)
OP_NAMES = ("sum", "max", "min")
SUM, MAX, MIN = range(len(OP_NAMES))
# the all-reduce algorithms (what each runs: iris_core.collectives.algorithms)
VARIANT_NAMES = ("one_shot", "two_shot", "atomic", "spinlock", "ring")
ONE_SHOT, TWO_SHOT, ATOMIC, SPINLOCK, RING = range(len(VARIANT_NAMES))


@triton.constexpr_function
def combines(kind):
    """Whether the members' contributions are combined (OP) into one output block."""
    return kind in (ALL_REDUCE, REDUCE_SCATTER)


@triton.constexpr_function
def gathers(kind):
    """Whether member i's contribution becomes output block i."""
    return kind in (ALL_GATHER, ALL_TO_ALL)


@triton.constexpr_function
def from_one_source(kind):
    """Whether the output comes from one member (SOURCES[me]; -1: none, zeros)."""
    return kind in (PPERMUTE, BROADCAST)


@triton.constexpr_function
def pipelined(kind, variant):
    """Whether the call runs the shared pipelined tile loop (every kind but the all-reduce
    algorithms of their own modules: two-shot, atomic, spinlock, ring)."""
    return kind != ALL_REDUCE or variant == ONE_SHOT


@triton.constexpr_function
def every_pair(kind, variant):
    """Whether every member sends to every other (the kinds that can be streamed)."""
    return variant == ONE_SHOT if kind == ALL_REDUCE else combines(kind) or gathers(kind)


def accumulator(dtype: str) -> str:
    """The type the members' contributions are combined in (the kernel's ACC), for a dtype by
    its numpy name: float32 for the 16-bit floats, so that a sum is rounded to the output's
    type once per element (as XLA and NCCL reduce bfloat16); every other dtype is its own
    (integer sums wrap as lax's do, maxima and minima are exact)."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


# the all-reduce algorithms that keep partial results in their workspace buffers, in ACC
KEEPS_PARTIALS = (RING, ATOMIC, SPINLOCK)
