"""What the fault gate (iris_jax.calls.fault_gate) costs a jitted step, by mode and by iris calls per step.

    python benchmarks/fault_gate.py [--calls 0,1,8,32] [--matmul 0,4096] [--steps 300] [--rounds 7]
                                    [--modes off,step,call] [--small]

A step is K rounds of `x = copy(sin(x) * 2)` over 1024 floats, `copy` an iris kernel (an
`iris_jax.triton_call`, gated like every iris kernel; a world of one, so that only the gate's
cost moves: a collective over one rank launches no kernel); K = 0 is the elementwise op alone.
With `--matmul M` the step also multiplies an M x M float32 matrix by itself once, so that the
GPU, not the host's launches, sets the pace (as in training). Per step: the host's wall time of
`steps` steps launched back to back then waited for once (pipelined, as a training loop runs),
and of steps each waited for (synced); and how many gates waited per step.

One runtime per (K, M): each mode's program is compiled in it (the gate is lowered with the
mode at a program's first trace), then the modes take turns, round after round, and each
figure is the median over `rounds` rounds (one round's time moves by tens of us, so modes
measured one after another in separate runtimes cannot be compared at that scale). "added" is
the median over the rounds of the step's time minus the same round's "off". On the simulator
(no GPU) no gate is lowered: the numbers say nothing there.
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


def _time_steps(f, state, steps: int, sync: bool) -> float:
    import jax

    state = jax.block_until_ready(f(*f(*state)))  # compiled for its own output sharding, and run
    start = time.perf_counter()
    for _ in range(steps):
        state = f(*state)
        if sync:
            jax.block_until_ready(state)
    jax.block_until_ready(state)
    return (time.perf_counter() - start) / steps * 1e6


def _program(calls: int, matmul: int):
    """A jitted step of `calls` iris calls (and one M x M matmul) over a world of one."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import iris_jax

    def copy(x):
        return iris_jax.triton_call(x, kernel=copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                    grid=(1,), N=x.shape[0])

    def step(x, w):
        for _ in range(calls):
            x = copy(jnp.sin(x) * 2)
        return (x if calls else jnp.sin(x) * 2), (jnp.tanh(w @ w) if matmul else w)

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("i",))
    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("i"), P()), out_specs=(P("i"), P())))


def measure(calls: int, matmul: int, modes: list[str], steps: int, rounds: int) -> list[dict]:
    """Each mode's time per step for steps of `calls` iris calls (and an M x M matmul)."""
    import jax
    import jax.numpy as jnp

    import iris_jax
    from iris_jax.calls import fault_gate

    iris_jax.shutdown()
    jax.clear_caches()
    rt = iris_jax.init(fault_gate="step", devices=jax.devices()[:1])
    state = (jnp.linspace(0, 1, 1024, dtype=jnp.float32), jnp.eye(max(matmul, 1), dtype=jnp.float32) * 0.5)
    programs = {}
    for mode in modes:  # "off" lowers no gate and "step" waits as the runtime's mode says: both run in it
        rt.fault_gate = mode
        f = programs[mode] = _program(calls, matmul)
        jax.block_until_ready(f(*f(*state)))  # lowered under its mode, for its inputs and its own outputs
    rt.fault_gate = "step"
    times = {mode: {"pipelined": [], "synced": []} for mode in modes}
    waited = {}
    for _ in range(rounds):
        for mode in modes:
            if mode == "call":
                continue  # below, in a runtime of its own
            before = fault_gate.waits()["waited"]
            times[mode]["pipelined"].append(_time_steps(programs[mode], state, steps, sync=False))
            times[mode]["synced"].append(_time_steps(programs[mode], state, steps, sync=True))
            waited[mode] = (fault_gate.waits()["waited"] - before) / (2 * steps + 4)
    if "call" in modes:  # its gates all wait, which the C step knows from the runtime's mode
        iris_jax.shutdown()
        jax.clear_caches()
        iris_jax.init(fault_gate="call", devices=jax.devices()[:1])
        f = _program(calls, matmul)
        before = fault_gate.waits()["waited"]
        for _ in range(rounds):
            times["call"]["pipelined"].append(_time_steps(f, state, steps, sync=False))
            times["call"]["synced"].append(_time_steps(f, state, steps, sync=True))
        waited["call"] = (fault_gate.waits()["waited"] - before) / rounds / (2 * steps + 4)
    rows = []
    for mode in modes:
        row = {"mode": mode, "calls": calls, "matmul": matmul, "waits": waited[mode]}
        for how, seen in times[mode].items():
            row[how] = statistics.median(seen)
            if "off" in times and mode not in ("off", "call"):  # the same rounds' difference
                row[f"added_{how}"] = statistics.median(a - b for a, b in zip(seen, times["off"][how]))
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="0,1,8,32")
    parser.add_argument("--matmul", default="0,4096", help="M of the step's M x M matmul (0: none)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--modes", default="off,step,call")
    small.add_flag(parser, "2 iris calls per step, 2 steps, every mode, on the CPU simulator (no gate there)")
    opts = parser.parse_args()
    if opts.small:
        small.use_simulator(1)
        opts.calls, opts.matmul, opts.steps, opts.rounds = "2", "0,8", 2, 1
    import jax

    print(f"devices: {jax.devices()}")
    print("| gate | iris calls per step | matmul | pipelined us/step | added | synced us/step | added "
          "| gates that waited per step |")
    print("|---|---|---|---|---|---|---|---|")
    added = lambda r, how: f"{r[f'added_{how}']:+.1f}" if f"added_{how}" in r else "-"
    for matmul in [int(m) for m in opts.matmul.split(",")]:
        for calls in [int(c) for c in opts.calls.split(",")]:
            for r in measure(calls, matmul, opts.modes.split(","), opts.steps, opts.rounds):
                print(f"| {r['mode']} | {calls} | {matmul or '-'} | {r['pipelined']:.1f} | {added(r, 'pipelined')} "
                      f"| {r['synced']:.1f} | {added(r, 'synced')} | {r['waits']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
