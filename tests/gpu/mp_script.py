"""One process of a multi-process GPU run, started by tests/gpu/launcher.py:

    python mp_script.py PROCESS_ID NUM_PROCESSES PORT [--shared] [--scenarios a,b] [--out DIR] [--limit S]

Each process is one rank (`jax.distributed.initialize`, iris heaps mapped through CUDA IPC):
on GPU PROCESS_ID (one process per GPU), or with --shared on GPU 0 with every other process
(several ranks on one GPU). It runs the scenarios of tests/gpu/scenarios.py in order, each
printing `process P: scenario NAME OK|FAIL ...`, and ends with `process P: OK` when all passed.
"""

import argparse
import faulthandler
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("process_id", type=int)
    parser.add_argument("num_processes", type=int)
    parser.add_argument("port")
    parser.add_argument("--shared", action="store_true", help="every process on GPU 0")
    parser.add_argument("--scenarios", default="kernels,collectives")
    parser.add_argument("--out", default=".", help="where scenarios write files (traces)")
    parser.add_argument("--heap-mib", type=int, default=768)  # two partitions' workspaces (axis_index_groups)
    parser.add_argument("--limit", type=float, default=150, help="seconds before dumping every stack and exiting")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.limit, exit=True)  # a hang shows where, before the launcher's limit
    import jax

    me = args.process_id
    jax.distributed.initialize(f"localhost:{args.port}", num_processes=args.num_processes, process_id=me,
                               local_device_ids=[0 if args.shared else me])
    import iris_jax
    from tests.gpu import scenarios

    print(f"process {me}: distributed up, {jax.local_devices()} of {jax.device_count()}", flush=True)
    rt = iris_jax.init(heap_size=args.heap_mib << 20)
    assert rt.mode == "gpu-multi-process", rt.mode
    world = scenarios.World(args.out, shared_gpu=args.shared)
    print(f"process {me}: rank {world.ranks}, heaps mapped {rt}", flush=True)
    names = [name for name in args.scenarios.split(",") if scenarios.applies(name, world.size)]
    passed = [scenarios.run(world, name) for name in names]
    sys.stdout.flush()
    if "timeouts" in names:  # a kernel trapped: this process's CUDA context is gone; skip the teardown
        print(f"process {me}: {'OK' if all(passed) else 'FAILED'}", flush=True)
        _leave_after_trap(me, args.num_processes, rt.store)
        os._exit(0 if all(passed) else 1)
    iris_jax.barrier()
    iris_jax.shutdown()
    print(f"process {me}: {'OK' if all(passed) else 'FAILED'}", flush=True)
    sys.exit(0 if all(passed) else 1)


def _leave_after_trap(me: int, processes: int, store) -> None:
    """Process 0 hosts JAX's coordination service: it leaves last, when every other process has
    left or 15 s per process on (a process still in its call then; JAX aborts it once the service
    is gone). Processes sharing a GPU trap one after another, each error a few seconds after its
    call (scenarios._one_trap_at_a_time), so the wait grows with them."""
    import time

    if me != 0:
        store.set(f"mp_script/left/{me}", b"1")
        return
    deadline = time.monotonic() + 15 * processes
    for p in range(1, processes):
        try:
            store.get(f"mp_script/left/{p}", max(deadline - time.monotonic(), 0.1))
        except Exception:  # noqa: BLE001 - it did not leave in time
            pass


if __name__ == "__main__":
    main()
