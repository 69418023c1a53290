"""One process of a case of the GPU fault matrix (tests/gpu/test_gpu_faults.py):

    python fault_matrix.py CASE PROCESS_ID NUM_PROCESSES PORT

Every process is a rank on GPU 0 (the shared-GPU mode of the GPU suite). The case makes one
fault happen, times how long each rank takes to get the named error, then takes the
survivors' next step (a new runtime, or the next call failing at once), and prints one line
`fault CASE process P: {json}` with what it saw. Cases:

    missing       the last rank never calls an all_reduce (timeout_s=TIMEOUT_S); the others
                  get PeerTimeoutError from JAX's own reads of the result (the fault gate)
                  and from iris_jax.block_until_ready; then shutdown() +
                  init() in every process, and an all_reduce that works
    killed        the last rank SIGKILLs itself in a loop of all_reduces; the others get
                  PeerTimeoutError, and their next call fails at once (PeerFailedError)
    mismatch      rank 0 sums 64 elements where the others sum 65 (lax.cond on axis_index):
                  every rank gets RankMismatchError naming both calls; then a new runtime
    guard         a kernel stores through an array that is not on the heap: JAX's reads of its
                  result and iris_jax.block_until_ready raise NotOnHeapError, once (check_faults()
                  then raises nothing; the watchdog reads host memory only, so it cannot see
                  the guard's status word); nothing was written; the runtime goes on
    exhausted     an allocation larger than the heap: HeapExhaustedError before anything runs
    tile_mismatch rank 0 runs a two-shot tile all-reduce where the others run a one-shot one:
                  every rank gets RankMismatchError naming both tile calls; then a new runtime
    missing_trap  as missing with on_fault="trap", through replace_lax_collectives: the CUDA
                  error of the trapped kernel comes as PeerTimeoutError (chained)
    fused_mismatch  rank 0 multiplies 32 rows in a matmul_all_reduce (impl="fused") where the
                  others multiply 64: every rank gets RankMismatchError naming both calls; the
                  group's next fused call fails at once (PeerFailedError); then a new runtime
    fused_missing the last rank never calls the fused matmul_all_reduce: the others get
                  PeerTimeoutError naming it; every rank's next fused call fails at once
                  (PeerFailedError: the lines were poisoned); then a new runtime
    guard_bound   stores just past the mapped heap, just below its upper bound and past it,
                  on the caller's heap and the next rank's, before and after the heap grows
                  (tests/gpu/heap_guard.py's heap_guard_bound, a heap of GUARD_BOUND_HEAP):
                  each refused and named, nothing written, the next call works; after the
                  growth a store at the old bound lands
"""

import faulthandler
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

TIMEOUT_S = 3.0
N = 65
HEAP_BYTES = 512 << 20  # the collective workspace takes about 200 MiB of it
GUARD_BOUND_HEAP = 4 << 30  # an upper bound past what a VMM heap maps at init (1 GiB): room to grow


def main():
    case, me, n, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    faulthandler.dump_traceback_later(80, exit=True)  # no case may hang: the stacks, then exit
    import jax

    jax.distributed.initialize(f"localhost:{port}", num_processes=n, process_id=me, local_device_ids=[0])
    import iris_jax

    rt = iris_jax.init(heap_size=GUARD_BOUND_HEAP if case == "guard_bound" else HEAP_BYTES,
                       on_fault="trap" if case == "missing_trap" else "exit")
    result = CASES[case](me, n, rt)
    print(f"fault {case} process {me}: {json.dumps(result)}", flush=True)
    os._exit(0)  # a dead peer or a lost CUDA context: no teardown through the coordination service


# -- helpers ---------------------------------------------------------------------------------------
def _mesh():
    import jax
    import numpy as np

    return jax.sharding.Mesh(np.array(jax.devices()), ("i",))


def _put(a):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return jax.make_array_from_callback(a.shape, NamedSharding(_mesh(), P("i")), lambda idx: a[idx])


def _smap(f):
    import jax
    from jax.sharding import PartitionSpec as P

    return jax.jit(jax.shard_map(f, mesh=_mesh(), in_specs=P("i"), out_specs=P("i"), check_vma=False))


def _ones(n):
    import numpy as np

    return _put(np.ones((n, N), np.float32))


def _reduce(u):
    import iris_jax

    return iris_jax.all_reduce(u, "i", timeout_s=TIMEOUT_S)


def _named(fn):
    """(error type, message, seconds, cause type) of fn() (None for the first when it returned)."""
    start = time.monotonic()
    try:
        fn()
        return None, "", time.monotonic() - start, None
    except Exception as e:  # noqa: BLE001 - what the case measures
        cause = type(e.__cause__).__name__ if e.__cause__ is not None else None
        return type(e).__name__, str(e)[:2000], time.monotonic() - start, cause


def _watchdog_s(rt, start, limit_s):
    """Seconds from `start` until the watchdog printed a record (None: not within limit_s)."""
    watch = rt.service("faults", None)
    while time.monotonic() - start < limit_s:
        if watch.reported_at is not None and watch.reported_at >= start:
            return watch.reported_at - start
        time.sleep(0.01)
    return None


def _fresh_runtime(n):
    """The survivors' next step after a fault that left every process alive: a new runtime."""
    import iris_jax

    def step():
        iris_jax.shutdown()
        iris_jax.init(heap_size=HEAP_BYTES)
        got = _smap(_reduce)(_ones(n))
        iris_jax.block_until_ready(got)
        value = float(got.addressable_shards[0].data[0, 0])
        assert value == n, f"all_reduce of ones gave {value}, not {n}"

    error, message, seconds, _ = _named(step)
    return f"{error}: {message}" if error else f"new runtime OK ({seconds:.1f} s)"


def _skips(n, absent):
    """Rank r's block of the `skip` operand: whether rank r leaves the collective out."""
    import numpy as np

    return _put((np.arange(n) == absent).reshape(n, 1))


def _reads(out) -> dict:
    """What each of JAX's own ways to read a result gives for this process's block of `out`: the
    error's type and the first line of its message, or "a value" (the fault gate's work)."""
    import jax
    import numpy as np

    block = out.addressable_shards[0].data
    reads = {
        "jax.block_until_ready": lambda: jax.block_until_ready(out),
        "np.asarray": lambda: np.asarray(block),
        "float": lambda: float(block.reshape(-1)[0]),
        ".item()": lambda: block[0, 0].item(),
        "jax.device_get": lambda: jax.device_get(block),
        "a later program": lambda: np.asarray(jax.jit(lambda b: b * 2 + 1)(block)),
    }
    seen = {}
    for name, read in reads.items():
        error, message, _, _ = _named(read)
        seen[name] = f"{error}: {message.splitlines()[0] if message else ''}"[:400] if error else "a value"
    return seen


def _evidence(rt, n) -> dict:
    """What this rank's kernels left behind, read before iris takes the records: each fault
    record (code, peer, flag epoch, GPU timer: one clock for ranks sharing a GPU) and, for the
    first programs, the flag line each member raised in this rank's collective workspace
    ([stamp, published offset, signatures of even and odd epochs]). A failure's evidence."""
    from iris_core import faults
    from iris_core.collectives.workspace import MAX_PROGRAMS
    from iris_core.flag_protocol import LINE_BYTES
    from iris_jax._runtime.workspace import workspaces

    rank = rt.heap.local_ranks[0]
    records = [[r.code, r.peer, r.epoch, r.time_ns] for r in faults.read_records(rt.heap.fault_words(rank))]
    base = workspaces(rt).offsets("collective")[0]
    lines = {}
    for pid in range(2):
        for member in range(n):
            at = base + (MAX_PROGRAMS + pid * n + member) * LINE_BYTES
            lines[f"p{pid}m{member}"] = [hex(w) if abs(w) > 1 << 20 else w for w in map(int, rt.heap.read_words(rank, at, 4))]
    epochs = [int(w) for w in rt.heap.read_words(rank, base, 2 * LINE_BYTES // 8)[::LINE_BYTES // 8]]
    return {"records": records, "flags": lines, "epochs": epochs}


def _calls_then_check(rt, call, me, n, absent, sync=True, evidence=False):
    """Runs `call` (compiled and run once before; after a host barrier), reads its result as JAX
    users do (each read must raise the named error), waits for the watchdog, then blocks on the
    result through iris: the named error and the times (with `evidence`, what the kernels left)."""
    import iris_jax

    if sync:
        rt.sync_processes()
    start = time.monotonic()
    out = call()
    reads = _reads(out)
    try:
        left = _evidence(rt, n) if evidence else None
    except Exception as e:  # noqa: BLE001 - evidence only
        left = f"no evidence: {type(e).__name__}: {e}"
    watchdog = None if me == absent else _watchdog_s(rt, start, TIMEOUT_S + 5)
    error, message, _, cause = _named(lambda: iris_jax.block_until_ready(out))
    result = {"error": error, "message": message, "seconds": time.monotonic() - start, "watchdog_s": watchdog,
              "cause": cause, "reads": reads}
    if left is not None:
        result["evidence"] = left
    return result


# -- the cases -------------------------------------------------------------------------------------
def missing(me, n, rt):
    from jax import lax

    import iris_jax

    absent = n - 1
    x = _ones(n)
    f = _smap(lambda v, skip: lax.cond(skip[0, 0], lambda u: u, _reduce, v))
    iris_jax.block_until_ready(f(x, _skips(n, -1)))  # compiled and run once with every rank
    skip = _skips(n, absent)
    result = _calls_then_check(rt, lambda: f(x, skip), me, n, absent)
    rt.sync_processes()
    result["next"] = _fresh_runtime(n)
    return result


def killed(me, n, rt):
    import iris_jax

    absent = n - 1
    x = _ones(n)
    f = _smap(_reduce).lower(x).compile()
    for _ in range(3):  # every rank in the loop
        iris_jax.block_until_ready(f(x))
    rt.sync_processes()
    if me == absent:
        os.kill(os.getpid(), signal.SIGKILL)
    result = _calls_then_check(rt, lambda: f(x), me, n, absent, sync=False)
    error, message, seconds, _ = _named(lambda: iris_jax.block_until_ready(f(x)))
    result["next"] = f"{error} after {seconds:.2f} s: {message[:300]}" if error else "returned"
    return result


def mismatch(me, n, rt):
    import jax.numpy as jnp
    from jax import lax

    x = _ones(n)
    fewer = lambda u: jnp.pad(_reduce(u[:, :N - 1]), ((0, 0), (0, 1)))  # noqa: E731 - 64 elements, not 65
    f = _smap(lambda v: lax.cond(lax.axis_index("i") == 0, fewer, _reduce, v)).lower(x).compile()
    result = _calls_then_check(rt, lambda: f(x), me, n, None, evidence=True)
    rt.sync_processes()
    result["next"] = _fresh_runtime(n)
    return result


def guard(me, n, rt):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import iris_jax
    from tests.gpu.heap_guard import BLOCK, store_to_rank

    off_heap = _put(np.full((n, N), -7.0, np.float32))  # XLA's memory, declared symmetric below
    x = _ones(n)

    def store(buf, v):
        peer = ((jax.lax.axis_index("i") + 1) % n).reshape(1)
        return iris_jax.triton_call(buf, v, N, peer, kernel=store_to_rank, out_shape=jax.ShapeDtypeStruct((1, N), jnp.float32),
                                    grid=(-(-N // BLOCK),), W=n, BLOCK=BLOCK, symmetric=(0,))

    f = _smap(store).lower(off_heap, x).compile()
    rt.sync_processes()
    start = time.monotonic()
    out = f(off_heap, x)
    reads = _reads(out)  # the call's own outputs name the refusal: nothing was accessed
    error, message, _, _ = _named(lambda: iris_jax.block_until_ready(out))
    result = {"error": error, "message": message, "seconds": time.monotonic() - start, "watchdog_s": None,
              "reads": reads, "again": _named(iris_jax.check_faults)[0]}  # reported once: None
    left = np.asarray(off_heap.addressable_shards[0].data)
    result["untouched"] = bool((left == -7.0).all())
    got = _smap(_reduce)(x)
    iris_jax.block_until_ready(got)
    ok = float(got.addressable_shards[0].data[0, 0]) == n
    result["next"] = "same runtime: all_reduce OK" if ok else "same runtime: all_reduce WRONG"
    return result


def guard_bound(me, n, rt):
    import iris_jax
    from tests.gpu.heap_guard import heap_guard_bound
    from tests.gpu.scenarios import World

    world = World(".", shared_gpu=True)
    mapped = rt.heap.mapped_size
    start = time.monotonic()
    heap_guard_bound(world)
    result = {"seconds": time.monotonic() - start, "checks": world.checks, "failures": world.failures[:10],
              "mapped": [mapped, rt.heap.mapped_size], "upper": rt.heap.heap_size}
    got = _smap(_reduce)(_ones(n))
    iris_jax.block_until_ready(got)
    ok = float(got.addressable_shards[0].data[0, 0]) == n
    result["next"] = "same runtime: all_reduce OK" if ok else "same runtime: all_reduce WRONG"
    return result


def exhausted(me, n, rt):
    import jax.numpy as jnp

    import iris_jax

    error, message, seconds, _ = _named(lambda: iris_jax.zeros((n, 64 << 20), jnp.float32))
    result = {"error": error, "message": message, "seconds": seconds, "watchdog_s": None}
    got = _smap(_reduce)(_ones(n))
    iris_jax.block_until_ready(got)
    ok = float(got.addressable_shards[0].data[0, 0]) == n
    result["next"] = "same runtime: all_reduce OK" if ok else "same runtime: all_reduce WRONG"
    return result


def missing_trap(me, n, rt):
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    absent = n - 1
    x = _ones(n)
    body = jax.shard_map(lambda v, skip: lax.cond(skip[0, 0], lambda u: u, lambda u: lax.psum(u, "i"), v),
                         mesh=_mesh(), in_specs=P("i"), out_specs=P("i"), check_vma=False)
    step = iris_jax.replace_lax_collectives(body, config=iris_jax.CollectiveConfig(timeout_s=TIMEOUT_S))
    iris_jax.block_until_ready(step(x, _skips(n, -1)))  # compiled and run once with every rank
    skip = _skips(n, absent)
    rt.sync_processes()
    start = time.monotonic()
    out = step(x, skip)
    watchdog = None if me == absent else _watchdog_s(rt, start, TIMEOUT_S + 5)
    del out  # (blocking on it with jax raises the CUDA error: the next step, through iris, names it)
    error, message, _, cause = _named(lambda: iris_jax.block_until_ready(step(x, skip)))
    return {"error": error, "message": message, "seconds": time.monotonic() - start, "watchdog_s": watchdog,
            "cause": cause, "next": "process ends (its CUDA context is lost)"}


def _fused(u, w, rows):
    """matmul_all_reduce (the fused kernel) of u's first `rows` rows with w, padded back."""
    import jax.numpy as jnp

    import iris_jax

    out = iris_jax.ops.matmul_all_reduce(u[:rows], w, "i", impl="fused", timeout_s=TIMEOUT_S)
    return jnp.pad(out, ((0, u.shape[0] - rows), (0, 0)))


def _fused_inputs(n):
    import numpy as np

    return _put(np.ones((n * 64, 32), np.float32)), _put(np.ones((n * 32, 128), np.float32))


def _fused_next(n):
    """After a fused op gave up: the group's next fused call (every rank) fails at once, then a
    new runtime whose fused call gives the right values."""
    import iris_jax

    f = _smap(lambda u, w: _fused(u, w, 64))
    error, message, seconds, _ = _named(lambda: iris_jax.block_until_ready(f(*_fused_inputs(n))))
    poisoned = f"{error} after {seconds:.2f} s: {message[:200]}" if error else "returned"

    def fresh():
        iris_jax.shutdown()
        iris_jax.init(heap_size=HEAP_BYTES)
        got = _smap(lambda u, w: _fused(u, w, 64))(*_fused_inputs(n))
        value = float(got.addressable_shards[0].data[0, 0])
        assert value == 32.0 * n, f"fused matmul_all_reduce of ones gave {value}, not {32 * n}"

    error, message, seconds, _ = _named(fresh)
    return poisoned, f"{error}: {message}" if error else f"new runtime OK ({seconds:.1f} s)"


def fused_mismatch(me, n, rt):
    from jax import lax

    a, b = _fused_inputs(n)
    f = _smap(lambda u, w: lax.cond(lax.axis_index("i") == 0, lambda u, w: _fused(u, w, 32),
                                    lambda u, w: _fused(u, w, 64), u, w)).lower(a, b).compile()
    result = _calls_then_check(rt, lambda: f(a, b), me, n, None)
    rt.sync_processes()
    result["poisoned"], result["next"] = _fused_next(n)
    return result


def fused_missing(me, n, rt):
    from jax import lax

    import iris_jax

    absent = n - 1
    a, b = _fused_inputs(n)
    f = _smap(lambda u, w, skip: lax.cond(skip[0, 0], lambda u, w: u[:, :1] * w[:1],
                                          lambda u, w: _fused(u, w, 64), u, w))
    iris_jax.block_until_ready(f(a, b, _skips(n, -1)))  # compiled and run once with every rank
    skip = _skips(n, absent)
    result = _calls_then_check(rt, lambda: f(a, b, skip), me, n, absent)
    rt.sync_processes()
    result["poisoned"], result["next"] = _fused_next(n)
    return result


def tile_mismatch(me, n, rt):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    import iris_jax
    from tests.core import tile_kernels as K
    from tests.gpu.kernels import tile_collective_call

    M, B = 128, 64
    x = iris_jax.to_heap(_put(np.ones((n * M, M), np.float32)))
    src, dst = iris_jax.zeros_like(x), iris_jax.zeros_like(x)
    locks = iris_jax.to_heap(_put(np.zeros((n, 64), np.int32)))

    def tile(op):
        return lambda x, s, d, lk: iris_jax.triton_call(
            x, s, d, lk, M, M, kernel=tile_collective_call, out_shape=jax.ShapeDtypeStruct((1, 1), jnp.int32),
            grid=(M // B, M // B), OP=op, W=n, BM=B, BN=B, NPR=B, num_warps=4, symmetric=(0, 1, 2, 3))

    f = _smap(lambda *a: lax.cond(lax.axis_index("i") == 0, tile(K.TWO_SHOT), tile(K.ONE_SHOT), *a))
    f = f.lower(x, src, dst, locks).compile()
    result = _calls_then_check(rt, lambda: f(x, src, dst, locks), me, n, None)
    rt.sync_processes()
    result["next"] = _fresh_runtime(n)
    return result


CASES = {"missing": missing, "killed": killed, "mismatch": mismatch, "guard": guard, "exhausted": exhausted,
         "missing_trap": missing_trap, "fused_mismatch": fused_mismatch, "fused_missing": fused_missing,
         "tile_mismatch": tile_mismatch, "guard_bound": guard_bound}

if __name__ == "__main__":
    main()
