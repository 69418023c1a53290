"""Where a process's first iris collective spends its time (issue 21, part 6).

    python benchmarks/startup.py [--processes 2] [--out DIR] [--heap-mib 1024]

--processes N starts N processes sharing GPU 0 (as tests/gpu/launcher.py's shared mode), one rank
each; without it, one process over its local devices (a world of one runs no kernel). Times, in order: `import iris_jax`,
`iris_jax.init()` (heaps allocated and zeroed, contexts), the first jitted psum (trace, lower,
Triton compile, first run), a second call, a new length (a new specialization), and lax.psum's
first call for comparison. Run it twice in a row to see a warm Triton cache (the second run).
Compiled kernels are kept on disk between processes (iris_jax.calls.kernel_cache): point
IRIS_KERNEL_CACHE_DIR at an empty directory for a cold first run, set it to "" for jax-triton's
own compile (in memory, as before). --jax-cache DIR also turns on JAX's persistent compilation
cache there (XLA's part). With --out, a cProfile of the first psum is written there (startup_profile.txt, the 40 most
expensive functions by cumulative time).
"""

import argparse
import cProfile
import io
import os
import pstats
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402


class _FirstImport:
    """A meta-path finder that records the Python stack of the first import of a module."""

    def __init__(self, name: str):
        self.name, self.stack = name, None

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name and self.stack is None:
            import traceback

            self.stack = "".join(traceback.format_stack(limit=25)[:-1])
        return None


def main():
    torch_import = _FirstImport("torch")
    sys.meta_path.insert(0, torch_import)
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--heap-mib", type=int, default=1024)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--jax-cache", default=None, help="directory of JAX's persistent compilation cache")
    parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    small.add_flag(parser, "one process, 2 ranks on the CPU simulator, 16 MiB heaps")
    args = parser.parse_args()
    if args.small:
        small.use_simulator()
        args.processes, args.heap_mib = 1, 16
    if args.processes > 1 and args.process_id is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        children = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--process-id", str(p), "--port",
                                      str(port)]) for p in range(args.processes)]
        sys.exit(max(child.wait() for child in children))
    times = {}

    def timed(name, fn):
        start = time.perf_counter()
        value = fn()
        times[name] = time.perf_counter() - start
        return value

    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    if args.jax_cache:
        jax.config.update("jax_compilation_cache_dir", args.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if args.process_id is not None:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        timed("jax.distributed", lambda: jax.distributed.initialize(
            f"127.0.0.1:{args.port}", args.processes, args.process_id, local_device_ids=[0]))
    timed("jax.devices()", jax.devices)
    iris_jax = timed("import iris_jax", lambda: __import__("iris_jax"))
    timed("iris_jax.init()", lambda: iris_jax.init(heap_size=args.heap_mib << 20))
    mesh = Mesh(np.array(jax.devices()), ("i",))

    def program(op):
        return jax.jit(jax.shard_map(lambda v: op(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))

    from jax.sharding import NamedSharding

    def ones(n):
        whole = np.ones(len(jax.devices()) * n, np.float32)
        return jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("i")), lambda i: whole[i])

    x = ones(4096)
    first = program(iris_jax.psum)
    profile = cProfile.Profile()
    profile.enable()
    timed("first iris psum", lambda: jax.block_until_ready(first(x)))
    profile.disable()
    timed("second call", lambda: jax.block_until_ready(first(x)))
    odd = ones(4099)
    timed("new length (4099)", lambda: jax.block_until_ready(program(iris_jax.psum)(odd)))
    if args.process_id is None:  # (NCCL refuses two ranks on one GPU)
        timed("first lax psum", lambda: jax.block_until_ready(program(jax.lax.psum)(x)))
    who = f"process {args.process_id}: " if args.process_id is not None else ""
    for name, seconds in times.items():
        print(f"{who}{name:24s} {seconds:8.3f} s", flush=True)
    from iris_jax.calls import kernel_cache

    cache = kernel_cache.cache()
    print(f"{who}kernel cache: " + (f"{cache.directory}: {cache.compiled} compiled, {cache.loaded} loaded"
                                    if cache else "off (jax-triton's own compile)"), flush=True)
    if not args.process_id:
        print("torch imported from:\n" + torch_import.stack if torch_import.stack else "torch never imported", flush=True)
    if args.out and not args.process_id:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "startup_profile.txt"), "w") as f:
            f.write(text.getvalue())


if __name__ == "__main__":
    main()
