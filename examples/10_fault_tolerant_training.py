"""Data-parallel training that survives a dead process: iris collectives, JAX's live devices.

    python -m iris_core.sim --survivors -n 4 examples/10_fault_tolerant_training.py     # simulator
    # GPUs: one process per GPU, each run as (add --local-device 0 to every one to share GPU 0)
    #   python examples/10_fault_tolerant_training.py --coordinator HOST:PORT --processes 4 --id I

Each process is a rank of a data-parallel linear regression: every step, each rank computes the
gradient of its share of that step's batch, and an iris psum adds them up. At step --kill-at the
last process SIGKILLs itself. The survivors' psum gives up after its timeout naming the dead
rank (reading the step's result raises: a failed call's outputs are never values), they ask
JAX which devices are alive (`jax.experimental.multihost_utils.live_devices`, with
`jax_enable_recoverability` on), start a new iris world over those (`iris_jax.shutdown()`, then
`iris_jax.init(devices=live)`), and redo the failed step with the same batch shared by fewer
ranks. The parameters live on the host between steps and no buffer is donated, so the failed
step consumed nothing: the last good state is still there. Every survivor finally checks its
parameters against numpy (the same batches, whatever the number of ranks). Process 0 runs
JAX's coordination service: if it dies, the job ends, as JAX's own fault tolerance says.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

D, BATCH, STEPS, LR = 16, 12, 8, 0.05  # BATCH splits evenly over 4, 3, 2 and 1 ranks
TIMEOUT_S = 2.0  # how long a psum waits for a peer
HEARTBEAT_S = 3  # how soon JAX's coordination service declares a silent process dead


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The step's global batch (the same on every process, whatever the world)."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((BATCH, D)).astype(np.float32)
    return x, (x @ np.linspace(-1, 1, D, dtype=np.float32)).astype(np.float32)


def reference() -> np.ndarray:
    w = np.zeros(D, np.float32)
    for step in range(STEPS):
        x, y = batch(step)
        w = w - LR * (x.T @ (x @ w - y)) / BATCH
    return w


def make_step(devices):
    """One training step over a world of `devices` (a mesh axis "i", a share of the batch each)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    config = iris_jax.CollectiveConfig(timeout_s=TIMEOUT_S)

    def local(w, x, y):
        grad = x.T @ (x @ w - y)  # this rank's share of the batch's summed gradient
        return w - LR * iris_jax.psum(grad, "i", config=config) / BATCH

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=P()))

    def step(w, t):
        x, y = batch(t)
        put = lambda a, spec: jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda i: a[i])  # noqa: E731
        out = f(put(w, P()), put(x, P("i")), put(y, P("i")))
        return np.asarray(out.addressable_shards[0].data)  # reading it raises if the step's psum gave up

    return step


def live_devices():
    """The devices of the processes still alive, once every one of them asks (JAX's barrier)."""
    import jax
    from jax.experimental import multihost_utils

    while True:
        try:
            with multihost_utils.live_devices(jax.devices()) as live:
                return live
        except multihost_utils.ProcessFailureError:  # a death seen during the barrier: ask again
            time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-at", type=int, default=3, help="the step at which the last process dies")
    parser.add_argument("--coordinator", help="JAX's coordinator address (not needed under iris_core.sim)")
    parser.add_argument("--processes", type=int)
    parser.add_argument("--id", type=int)
    parser.add_argument("--local-device", type=int, help="the GPU this process takes (default: JAX's choice)")
    opts = parser.parse_args()
    import jax

    jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(opts.coordinator, opts.processes, opts.id, heartbeat_timeout_seconds=HEARTBEAT_S,
                               local_device_ids=None if opts.local_device is None else [opts.local_device])
    import iris_jax

    me, n = jax.process_index(), jax.process_count()
    iris_jax.init()
    devices = sorted(jax.devices(), key=lambda d: d.id)
    step = make_step(devices)
    w, t = np.zeros(D, np.float32), 0
    while t < STEPS:
        if t == opts.kill_at and me == n - 1:
            print(f"process {me}: dying at step {t}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        try:
            w, t = step(w, t), t + 1  # w is replaced only by a step that succeeded
        except Exception as e:  # noqa: BLE001 - JaxRuntimeError carrying iris's named error
            first = str(e).splitlines()[0]
            print(f"process {me}: step {t} failed after {time.monotonic() - start:.1f} s: {first[:300]}", flush=True)
            devices = live_devices()
            iris_jax.shutdown()
            iris_jax.init(devices=devices)
            step = make_step(devices)
            print(f"process {me}: a new world of {len(devices)} ranks after {time.monotonic() - start:.1f} s; "
                  f"redoing step {t}", flush=True)
    np.testing.assert_allclose(w, reference(), rtol=1e-5, atol=1e-6)
    print(f"process {me}: {STEPS} steps, {len(devices)} ranks at the end, parameters equal numpy's", flush=True)
    iris_jax.shutdown()
    leave(live_devices())


def leave(survivors) -> None:
    """Ends the process once every survivor is done. JAX's own shutdown at exit would wait for every
    process it ever knew, the dead one too; and process 0 runs the coordination service, whose end
    makes a process still talking to it abort: so the others leave first, and process 0 once JAX no
    longer counts them alive (its heartbeat timeout: the others never join this last query, which
    returns once they are gone)."""
    import jax
    from jax._src import distributed

    if jax.process_index() == 0:
        distributed.global_state.client.get_live_nodes(sorted({d.process_index for d in survivors}))
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
