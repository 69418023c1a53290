"""The GPU fault matrix (issue 34): each fault in processes sharing GPU 0, at 2 and 4 ranks.

Each case (tests/gpu/fault_matrix.py) starts its own processes: a rank that never calls, a
rank SIGKILLed in a loop of collectives, ranks taking branches with collectives of different
sizes, a kernel refused by the heap guard, an exhausted heap, (2 ranks) a rank that never
calls with on_fault="trap", for the fused GEMM ops calls that differ and a rank that never
calls, and tile-level collectives that differ. Every other rank must get the error that names
the op and the rank within the timeout plus a second (the watchdog's report as well), and then take its next
step: a new runtime that works, or a next call that fails at once. No process may hang: each
run is bounded. The times go to benchmarks/RESULTS.md (the simulator's table is
tests/jax/test_faults.py's).

The worlds run JOBS at a time (IRIS_GPU_FAULT_JOBS, default 3; 1 runs them one after another):
the module's first test starts the worlds of every selected test in the background, in the
tests' order, and each test waits for its own (examples/10's world runs alone, last). A world
spends most of its time starting its processes and in 3-s timeouts, so five runs of the matrix
fit one device call this way. Few at a time: the timed calls share GPU 0 and the CPUs with the
other worlds' start-up.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.gpu import launcher
from tests.gpu.fault_matrix import TIMEOUT_S

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).with_name("fault_matrix.py")
LIMIT_S = 90
SLACK_S = 1.0  # the bound: the configured timeout plus a second
LINE = re.compile(r"^fault (\S+) process (\d+): (\{.*\})$", re.M)
JOBS = int(os.environ.get("IRIS_GPU_FAULT_JOBS", "3"))
RESULTS = {}  # (case, world) -> {process: result}, printed at the end for RESULTS.md
_PORTS = set()  # given to a world: its coordinator binds the port only once jax is imported
_PORTS_LOCK = threading.Lock()


def _port() -> int:
    """A free port that no other world of this session was given."""
    with _PORTS_LOCK:
        port = launcher._free_port()
        while port in _PORTS:
            port = launcher._free_port()
        _PORTS.add(port)
    return port


def _run(case: str, world: int, log_dir: Path) -> tuple[dict, list[str]]:
    """Runs `case` at `world` ranks, ending what still runs LIMIT_S after its start; returns each
    process's report and the logs."""
    port = _port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_PYTHON_CLIENT_MEM_FRACTION="0.05", PYTHONPATH=f"{launcher.ROOT}{os.pathsep}"
               f"{os.environ.get('PYTHONPATH', '')}")
    logs = [log_dir / f"{case}_w{world}_p{p}.log" for p in range(world)]
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), case, str(p), str(world), str(port)], cwd=launcher.ROOT,
                              env=env, stdout=open(logs[p], "w"), stderr=subprocess.STDOUT, start_new_session=True)
             for p in range(world)]
    deadline = time.monotonic() + LIMIT_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    hung = [i for i, p in enumerate(procs) if p.poll() is None]
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    texts = [log.read_text(errors="replace") for log in logs]
    assert not hung, f"{case} at {world} ranks: process(es) {hung} still running after {LIMIT_S} s:\n" + \
        "\n".join(texts[i][-3000:] for i in hung)
    found = {int(m.group(2)): json.loads(m.group(3)) for text in texts for m in LINE.finditer(text)
             if m.group(1) == case}
    RESULTS[case, world] = found
    return found, texts


@pytest.fixture(scope="module")
def worlds(request, tmp_path_factory):
    """(case, world) -> the future of _run: the world of every selected test of this module,
    started JOBS at a time in the tests' order."""
    if launcher.gpu_count() < 1:
        pytest.fail("the gpu tests need a GPU (they never skip)")
    log_dir = Path(os.environ.get("IRIS_GPU_LOG_DIR") or tmp_path_factory.mktemp("fault_matrix")) / "faults"
    log_dir.mkdir(parents=True, exist_ok=True)
    keys = dict.fromkeys((item.callspec.params["case"], item.callspec.params["world"])
                         for item in request.session.items if item.parent is request.node and hasattr(item, "callspec"))
    pool = ThreadPoolExecutor(JOBS)
    yield {key: pool.submit(_run, *key, log_dir) for key in keys}
    pool.shutdown(cancel_futures=True)  # after -x: no new world; the running ones end by their limit


def _worlds(case: str, *sizes: int):
    """Parametrizes a test with fault_matrix.py's `case` at each of `sizes` ranks (ids: the sizes)."""
    return pytest.mark.parametrize(("case", "world"), [(case, n) for n in sizes], ids=[str(n) for n in sizes])


def _survivors(found, texts, world, absent):
    for p in range(world):
        if p != absent:
            assert p in found, f"process {p} reported nothing:\n{texts[p][-4000:]}"
    return [found[p] for p in range(world) if p != absent]


def _named_in_time(r, error, *words, watchdog=True, reads=True):
    assert r["error"] == error, r
    if reads:  # JAX's own reads of the failed call's result raise the named error, never give numbers
        assert r["reads"] and all(f"{error}: " in seen and words[0] in seen for seen in r["reads"].values()), \
            r["reads"]
    for word in words:
        assert word in r["message"], (word, r["message"])
    assert r["seconds"] < TIMEOUT_S + SLACK_S + 0.5, r  # (+ the block_until_ready of a kernel that exited)
    if watchdog:
        assert r["watchdog_s"] is not None and r["watchdog_s"] < TIMEOUT_S + SLACK_S, r


@_worlds("missing", 2, 4)
def test_rank_that_never_calls(worlds, case, world):
    found, texts = worlds[case, world].result()
    for r in _survivors(found, texts, world, world - 1):
        _named_in_time(r, "PeerTimeoutError", "iris all_reduce(sum)", f"rank {world - 1}", "group of ranks")
    for p in range(world):
        assert found[p]["next"].startswith("new runtime OK"), (p, found[p])
    assert "iris watchdog: PeerTimeoutError" in texts[0]


@_worlds("killed", 2, 4)
def test_rank_killed_mid_loop(worlds, case, world):
    found, texts = worlds[case, world].result()
    assert world - 1 not in found  # it died
    for r in _survivors(found, texts, world, world - 1):
        _named_in_time(r, "PeerTimeoutError", "iris all_reduce(sum)", f"rank {world - 1}")
        assert r["next"].startswith("PeerFailedError after"), r["next"]
        assert float(r["next"].split()[2]) < SLACK_S, r["next"]  # at once


def _calls_that_differ(worlds, case, world, *words) -> list:
    """Every rank gets RankMismatchError naming both calls, within the slack, and then a new
    runtime works; returns the ranks' results."""
    found, texts = worlds[case, world].result()
    survivors = _survivors(found, texts, world, None)
    for r in survivors:
        _named_in_time(r, "RankMismatchError", *words)
        assert r["seconds"] < SLACK_S, r
        assert r["next"].startswith("new runtime OK"), r
    return survivors


@_worlds("mismatch", 2, 4)
def test_ranks_that_take_different_branches(worlds, case, world):
    _calls_that_differ(worlds, case, world, "iris all_reduce(sum)", "float32[1, 64]", "float32[1, 65]")


@_worlds("tile_mismatch", 2, 4)
def test_tile_collectives_that_differ(worlds, case, world):
    _calls_that_differ(worlds, case, world, "iris tile collective (flag)",
                       "tile all_reduce_one_shot of float32", "tile all_reduce_two_shot of float32")


@_worlds("guard", 2, 4)
def test_kernel_refused_by_the_heap_guard(worlds, case, world):
    found, texts = worlds[case, world].result()
    for r in _survivors(found, texts, world, None):
        _named_in_time(r, "NotOnHeapError", "store to rank", "nothing was accessed", watchdog=False)
        assert r["again"] is None and r["untouched"] and r["next"] == "same runtime: all_reduce OK", r


@_worlds("guard_bound", 2, 4)
def test_the_guard_bound_is_what_is_mapped(worlds, case, world):
    """Issue 66: every refusal named (its message checked), nothing written, the next call working,
    before and after a growth."""
    found, texts = worlds[case, world].result()
    for r in _survivors(found, texts, world, None):
        assert not r["failures"] and r["checks"] > 0, r
        assert r["mapped"][1] > r["mapped"][0], f"the heap did not grow: {r}"
        assert r["next"] == "same runtime: all_reduce OK", r


@_worlds("exhausted", 2, 4)
def test_heap_exhausted(worlds, case, world):
    found, texts = worlds[case, world].result()
    for r in _survivors(found, texts, world, None):
        _named_in_time(r, "HeapExhaustedError", watchdog=False, reads=False)  # nothing ran
        assert r["next"] == "same runtime: all_reduce OK", r


@_worlds("fused_mismatch", 2, 4)
def test_fused_calls_that_differ(worlds, case, world):
    for r in _calls_that_differ(worlds, case, world, "iris matmul_all_reduce", "[32 x 32] @ [32 x 128]",
                                "[64 x 32] @ [32 x 128]"):
        assert r["poisoned"].startswith("PeerFailedError after"), r["poisoned"]
        assert float(r["poisoned"].split()[2]) < SLACK_S, r["poisoned"]  # at once


@_worlds("fused_missing", 2, 4)
def test_fused_call_without_a_rank(worlds, case, world):
    found, texts = worlds[case, world].result()
    for r in _survivors(found, texts, world, world - 1):
        _named_in_time(r, "PeerTimeoutError", "iris matmul_all_reduce", f"rank {world - 1}")
    for p in range(world):  # the absent rank too: the survivors poisoned their lines in its workspace
        assert found[p]["poisoned"].startswith("PeerFailedError after"), (p, found[p]["poisoned"])
        assert float(found[p]["poisoned"].split()[2]) < SLACK_S, (p, found[p]["poisoned"])
        assert found[p]["next"].startswith("new runtime OK"), (p, found[p])


@_worlds("missing_trap", 2)
def test_trapped_kernel_named_through_replace_lax_collectives(worlds, case, world):
    found, texts = worlds[case, world].result()
    (r,) = _survivors(found, texts, 2, 1)
    _named_in_time(r, "PeerTimeoutError", "iris all_reduce(sum)", "rank 1", reads=False)  # a CUDA error


def test_zz_print_the_matrix():
    """The times of every case (the slowest rank), for benchmarks/RESULTS.md."""
    for (case, world), found in sorted(RESULTS.items()):
        times = [r["seconds"] for r in found.values() if r.get("error")]
        watch = [r["watchdog_s"] for r in found.values() if r.get("watchdog_s") is not None]
        print(f"fault matrix | {case} | {world} ranks | {sorted({r.get('error') for r in found.values()}, key=str)} | "
              f"named after {max(times, default=float('nan')):.2f} s | watchdog {max(watch, default=float('nan')):.2f} s"
              f" | next: {sorted({str(r.get('next'))[:60] for r in found.values()})}")


def test_survivors_reform_and_finish():
    """examples/10 on GPU 0 as 4 processes: the last SIGKILLs itself at step 3; each survivor's step
    fails naming it within the psum's timeout plus a second, the survivors form a world of 3 over
    JAX's live devices and finish with numpy's parameters."""
    if launcher.gpu_count() < 1:
        pytest.fail("the gpu tests need a GPU (they never skip)")
    port = _port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_PYTHON_CLIENT_MEM_FRACTION="0.05", IRIS_HEAP_SIZE=str(256 << 20),
               PYTHONPATH=f"{launcher.ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    script = Path(launcher.ROOT) / "examples" / "10_fault_tolerant_training.py"
    procs = [subprocess.Popen([sys.executable, str(script), "--coordinator", f"localhost:{port}", "--processes", "4",
                               "--id", str(p), "--local-device", "0"], cwd=launcher.ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for p in range(4)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=LIMIT_S)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(still running: killed)")
    for p in range(3):
        print("\n".join(line for line in outs[p].splitlines() if line.startswith("process ")))
        failed = re.search(rf"process {p}: step 3 failed after ([\d.]+) s: .*PeerTimeoutError: iris all_reduce\(sum\): "
                           r"timed out waiting for rank 3", outs[p])
        assert failed and float(failed.group(1)) < 2.0 + SLACK_S, outs[p][-4000:]
        assert f"process {p}: 8 steps, 3 ranks at the end, parameters equal numpy's" in outs[p], outs[p][-4000:]
        assert procs[p].returncode == 0, outs[p][-4000:]
    assert procs[3].returncode == -9, outs[3][-2000:]
