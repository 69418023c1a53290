"""Does JAX report a kernel's `trap` when the host is already waiting? (one GPU, one process)

    python benchmarks/trap_probe.py CASE      # CASE: early | late | late_chain | sync_after

A jax-triton kernel spins on %globaltimer for SPIN seconds, then traps (as iris's peer timeout
does). The host then:
  early:      calls block_until_ready at once (the trap happens while the host waits);
  late:       sleeps past the trap, then blocks (the trap happened before the wait);
  late_chain: as early, with a second kernel after the trapping one in the same jit;
  sync_after: as early, through jax.effects_barrier() instead of block_until_ready;
  spin:       no trap: spins 6 s and returns (run beside `early` in another process: does a
              neighbour's trap on the same GPU stop or stall this kernel?).
Prints `CASE: raised after S s: ...` or `CASE: returned after S s`. A case that prints neither
within its parent's limit hung (the question the shared-GPU timeout runs raised at 4 and 8 ranks).
    python benchmarks/trap_probe.py --small   # compiles the kernel for sm_90 (no GPU needed)
"""

import os
import sys
import time

import triton
import triton.language as tl

SPIN_S = 2.0


@triton.jit
def spin_then_trap(x_ptr, out_ptr, SPIN_NS: tl.constexpr, TRAP: tl.constexpr):
    start = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    now = start
    while now - start < SPIN_NS:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    if TRAP:
        tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out_ptr + tl.arange(0, 16), tl.load(x_ptr + tl.arange(0, 16)) + 1)


def call(x, trap, spin_s=0.0):
    import jax
    import jax_triton as jt  # (here, as jax: --small needs neither, and jax_triton imports only with JAX's CUDA plugin)

    return jt.triton_call(x, kernel=spin_then_trap, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
                          SPIN_NS=int(spin_s * 1e9), TRAP=trap)


def main(case: str):
    import jax
    import jax.numpy as jnp

    x = jnp.zeros(16, jnp.float32)
    jax.block_until_ready(jax.jit(lambda v: call(v, False))(x))  # compiled and warm
    chain = case == "late_chain"
    if case == "spin":
        f = jax.jit(lambda v: call(v, False, 6.0))
    else:
        f = jax.jit(lambda v: call(call(v, True, SPIN_S), False) if chain else call(v, True, SPIN_S))
    start = time.monotonic()
    try:
        y = f(x)
        if case == "late":
            time.sleep(SPIN_S + 2)
        if case == "sync_after":
            jax.effects_barrier()
        jax.block_until_ready(y)
        print(f"{case}: returned after {time.monotonic() - start:.1f} s", flush=True)
    except Exception as e:  # noqa: BLE001 - the question is what comes back
        print(f"{case}: raised after {time.monotonic() - start:.1f} s: {type(e).__name__}: {str(e)[:200]}", flush=True)


def compile_small():
    """--small: the kernel as `early` launches it, compiled for sm_90."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import small

    small.compile_all({"spin_then_trap": (spin_then_trap, {"x_ptr": "*fp32", "out_ptr": "*fp32"},
                                          dict(SPIN_NS=int(SPIN_S * 1e9), TRAP=True), {})})


if __name__ == "__main__":
    compile_small() if sys.argv[1] == "--small" else main(sys.argv[1])
