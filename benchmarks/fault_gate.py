"""What the fault gate (iris_jax.calls.fault_gate) costs a jitted step, by mode and by iris calls per step.

    python benchmarks/fault_gate.py [--calls 0,1,8,32] [--steps 400] [--rounds 5] [--modes off,step,call] [--small]

A step is K rounds of `x = copy(sin(x) * 2)` over 1024 floats, `copy` an iris kernel (an
`iris_jax.triton_call`, gated like every iris kernel; a world of one, so that only the gate's
cost moves: a collective over one rank launches no kernel); K = 0 is the elementwise op alone. Per step: the host's wall time of `steps` steps launched
back to back then waited for once (pipelined, as a training loop runs), and of steps each
waited for (synced), the median of `rounds` rounds (a round's time moves by tens of us); and
how many gates waited per step. Every mode runs in this process, in a
fresh runtime with JAX's caches cleared (the gate is lowered with the setting of a program's
first trace). On the simulator (no GPU) no gate is lowered: the numbers say nothing there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402


@triton.jit
def copy_kernel(context_ptr, x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


def _time_steps(f, x, steps: int, sync: bool) -> float:
    import jax

    x = jax.block_until_ready(f(f(x)))  # compiled for its own output sharding, and run
    start = time.perf_counter()
    for _ in range(steps):
        x = f(x)
        if sync:
            jax.block_until_ready(x)
    jax.block_until_ready(x)
    return (time.perf_counter() - start) / steps * 1e6


def measure(mode: str, calls: int, steps: int, rounds: int = 1) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_jax.calls import fault_gate

    iris_jax.shutdown()
    jax.clear_caches()
    iris_jax.init(fault_gate=mode, devices=jax.devices()[:1])
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("i",))

    def copy(x):
        return iris_jax.triton_call(x, kernel=copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                    grid=(1,), N=x.shape[0])

    def step(x):
        for _ in range(calls):
            x = copy(jnp.sin(x) * 2)
        return x if calls else jnp.sin(x) * 2

    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jnp.linspace(0, 1, 1024, dtype=jnp.float32)
    pipelined = statistics.median(_time_steps(f, x, steps, sync=False) for _ in range(rounds))
    before = fault_gate.waits()
    synced = _time_steps(f, x, steps, sync=True)
    waited = (fault_gate.waits()["waited"] - before["waited"]) / (steps + 2)
    synced = statistics.median([synced, *(_time_steps(f, x, steps, sync=True) for _ in range(rounds - 1))])
    return {"mode": mode, "calls": calls, "pipelined_us": pipelined, "synced_us": synced, "waits": waited}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="0,1,8,32")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="off,step,call")
    small.add_flag(parser, "2 iris calls per step, 2 steps, every mode, on the CPU simulator (no gate there)")
    opts = parser.parse_args()
    if opts.small:
        small.use_simulator(1)
        opts.calls, opts.steps, opts.rounds = "2", 2, 1
    import jax

    print(f"devices: {jax.devices()}")
    print("| gate | iris calls per step | pipelined us/step | synced us/step | gates that waited per step |")
    print("|---|---|---|---|---|")
    for calls in [int(c) for c in opts.calls.split(",")]:
        for mode in opts.modes.split(","):
            r = measure(mode, calls, opts.steps, opts.rounds)
            print(f"| {r['mode']} | {calls} | {r['pipelined_us']:.1f} | {r['synced_us']:.1f} | {r['waits']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
