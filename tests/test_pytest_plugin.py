"""pytest-iris (pytest_iris/, issue 69) as its users meet it: pytest run on a user's test files
(pytest's `pytester`, each run its own process, in a user's environment: no XLA_FLAGS, no
JAX_PLATFORMS, the plugin loaded by its entry point), each outcome with the text it must show."""

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "testing"

KERNELS = '''
import jax, jax.numpy as jnp, numpy as np, pytest, triton, triton.language as tl
from jax.sharding import NamedSharding, PartitionSpec as P
import iris_jax
from iris_jax import Context
from iris_core.device import nanosleep


@triton.jit
def store_then_read(context_ptr, inbox_ptr, x_ptr, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """Stores into the next rank's inbox and reads its own with nothing in between: a race."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    ctx.store(inbox_ptr + offs, tl.load(x_ptr + offs), to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr + offs, tl.load(inbox_ptr + offs))


@triton.jit
def wait_for_flag(context_ptr, flag_ptr, out_ptr, W: tl.constexpr):
    """Waits for a flag that no rank ever sets."""
    ctx = Context.initialize(context_ptr, W)
    while ctx.atomic_add(flag_ptr, 0, to_rank=ctx.rank, sem="acquire", scope="sys") == 0:
        nanosleep(1_000_000)
    tl.store(out_ptr, ctx.rank)


def run(world, kernel, *, out, **params):
    rows = NamedSharding(world.mesh, P("i"))
    buf = iris_jax.zeros((world.size * 16,), jnp.float32, sharding=rows)
    x = jax.device_put(jnp.ones((world.size * 16,), jnp.float32), rows)
    args = (buf, x) if kernel is store_then_read else (buf,)
    call = lambda *a: iris_jax.triton_call(*a, kernel=kernel, out_shape=jax.ShapeDtypeStruct((out,), jnp.float32),
                                           grid=(1,), W=world.size, symmetric=(0,), **params)
    return jax.jit(jax.shard_map(call, mesh=world.mesh, in_specs=(P("i"),) * len(args), out_specs=P("i")))(*args)
'''


@pytest.fixture
def user(pytester, monkeypatch):
    """A user's project folder and environment: none of this suite's JAX settings."""
    for name in ("XLA_FLAGS", "JAX_PLATFORMS", "IRIS_SIM_CHECKED", "IRIS_DETECT_RACES", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    return pytester


def _run(pytester, *args, timeout=600):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", *args, timeout=timeout)


def test_a_project_without_the_marker_is_unchanged(user):
    """No JAX import, no device flags, no fixtures: the plugin is registered and does nothing else."""
    user.makepyfile(test_plain='''
        import os, sys
        def test_nothing_of_jax(request):
            assert "jax" not in sys.modules and "iris_jax" not in sys.modules
            assert "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
            assert "jax_triton" not in sys.modules
        ''')
    result = _run(user, "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    markers = _run(user, "--markers")
    markers.stdout.fnmatch_lines(["@pytest.mark.iris(ranks=2, *processes=False*"])


def test_the_example_project_passes_at_2_4_and_8_ranks(user):
    """examples/testing: a user's kernel and its tests, sizes parametrized (ids say the size),
    one of them as one process per rank."""
    for name in ("ring.py", "test_ring.py", "conftest.py"):
        shutil.copy(EXAMPLE / name, user.path / name)
    result = _run(user, "-v")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*test_shift_moves_each_block_to_the_next_rank?ranks=2? PASSED*",
                                 "*test_shift_moves_each_block_to_the_next_rank?ranks=4? PASSED*",
                                 "*test_shift_moves_each_block_to_the_next_rank?ranks=8? PASSED*",
                                 "*test_shift_is_lax_ppermute PASSED*",
                                 "*test_shift_with_one_process_per_rank PASSED*"])


def test_a_race_fails_the_test_with_the_detectors_report_and_nothing_leaks(user):
    """A store into the next rank's inbox and a read of one's own, unordered: the test fails with
    RaceError naming both accesses' lines and the remedy; the next test, in the same session,
    gets a fresh runtime and passes; detect_races=False lets the same kernel run."""
    user.makepyfile(kernels=KERNELS)
    user.makepyfile(test_race='''
        import pytest
        import iris_jax
        from kernels import run, store_then_read

        @pytest.mark.iris(ranks=2)
        def test_racy(iris_world):
            run(iris_world, store_then_read, out=16, BLOCK=16).block_until_ready()

        @pytest.mark.iris(ranks=2)
        def test_after_it(iris_world):
            assert iris_jax.memory_stats()["arrays_bytes_in_use"] == 0  # a fresh heap
            assert iris_world.runtime.world_size == 2

        @pytest.mark.iris(ranks=2, detect_races=False)
        def test_racy_unchecked(iris_world):
            run(iris_world, store_then_read, out=16, BLOCK=16).block_until_ready()
        ''')
    result = _run(user, "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*RaceError*", "*kernels.py:*", "*FAILED test_race.py::test_racy*"])


def test_a_wait_that_never_ends_fails_the_test_within_its_timeout(user):
    """A kernel waiting on a flag that no one sets: the test fails within timeout_s (plus the
    simulator's slack), naming the ranks and the kernel; the next test runs."""
    user.makepyfile(kernels=KERNELS)
    user.makepyfile(test_hang='''
        import time
        import pytest
        from kernels import run, wait_for_flag

        @pytest.mark.iris(ranks=2, timeout_s=2, detect_races=False)
        def test_hangs(iris_world):
            start = time.monotonic()
            try:
                run(iris_world, wait_for_flag, out=1).block_until_ready()
            finally:
                print(f"named after {time.monotonic() - start:.1f} s")

        @pytest.mark.iris(ranks=2)
        def test_next(iris_world):
            assert iris_world.size == 2
        ''')
    result = _run(user, "-p", "no:randomly", "-s")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*PeerTimeoutError: simulated rank(s) [[]*[]] did not finish within 7 s (kernel wait_for_flag*where each rank was:",
        # the poll's line or the sleep's, as the signal finds it
        "*  rank ?: kernel wait_for_flag at *kernels.py:2[12] (wait_for_flag) in *; its last read of one word: "
        "rank ?'s heap at offset *: an unnamed allocation*byte 0 (fp32), value 0.0, read * times in a row"])
    seconds = float(next(line for line in result.outlines if "named after" in line).split()[-2])
    assert seconds < 2 + 5 + 5, seconds


@pytest.mark.parametrize(("marker", "message"), [
    ("ranks=0", "a world size is a positive int, got 0"),
    ("ranks=(2, 2)", "give each world size once"),
    ("ranks=100000", "more than this host holds"),
    ("ranks=2, timeout_s=-1", "a positive number of seconds"),
    ("ranks=2, rank=4", "has no argument rank"),
])
def test_a_marker_that_cannot_be_honoured_is_an_error_before_anything_runs(user, marker, message):
    user.makepyfile(test_bad=f'''
        import pytest

        @pytest.mark.iris({marker})
        def test_it(iris_world):
            raise AssertionError("the body ran")
        ''')
    result = _run(user)
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*test_bad.py::test_it: @pytest.mark.iris*{message}*"])
    assert "the body ran" not in result.stdout.str()


def test_a_backend_started_too_early_is_named_with_what_to_change(user):
    """A test module that starts JAX's CPU backend at import leaves one device: the marked test
    errors, saying what to change, before its body runs."""
    user.makepyfile(test_early='''
        import jax, pytest
        jax.devices()  # the backend starts here, at collection, with one CPU device

        @pytest.mark.iris(ranks=4)
        def test_it(iris_world):
            raise AssertionError("the body ran")
        ''')
    result = _run(user)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*asks for 4 simulated ranks but JAX's CPU backend has 1 device*Move that into a "
                                 "test or fixture, or start pytest with XLA_FLAGS=--xla_force_host_platform_device_"
                                 "count=4 (or more)*"])
    assert "the body ran" not in result.stdout.str()


def test_iris_world_without_the_marker_says_so(user):
    user.makepyfile(test_unmarked='''
        def test_it(iris_world):
            pass
        ''')
    result = _run(user)
    result.stdout.fnmatch_lines(["*the iris_world fixture needs @pytest.mark.iris(ranks=N)*"])


def test_it_runs_under_pytest_xdist(user):
    """`pytest -n 2` (pytest-xdist, in the test extra): each worker asks JAX for its own devices
    and starts its own runtimes; the processes=True test launches its ranks from a worker."""
    for name in ("ring.py", "test_ring.py", "conftest.py"):
        shutil.copy(EXAMPLE / name, user.path / name)
    result = _run(user, "-n", "2")
    result.assert_outcomes(passed=5)


def test_iris_gpu_without_a_gpu_skips_saying_so(user):
    """`pytest --iris-gpu` on a machine without GPUs: each marked test is skipped with its reason (the
    in-process ones: too few GPUs; processes=True: no GPU for its processes), none fails or hangs."""
    for name in ("ring.py", "test_ring.py", "conftest.py"):
        shutil.copy(EXAMPLE / name, user.path / name)
    result = _run(user, "--iris-gpu", "-rs")
    result.assert_outcomes(skipped=5)
    result.stdout.fnmatch_lines(["*needs 2 GPUs (--iris-gpu); this machine has 0*",
                                 "*processes=True under --iris-gpu needs a GPU; this machine's CUDA driver sees none*"])


def test_faults_on_demand_are_named_as_real_ones(user):
    """iris_faults: a rank that dies at its second call (the call fails within the marker's
    timeout, naming the rank), a rank whose call differs (RankMismatchError naming both calls), a
    rank arriving late within the timeout (the call completes), a heap that runs out."""
    user.makepyfile(test_faults='''
        import time
        import jax, jax.numpy as jnp, numpy as np, pytest
        from jax.sharding import NamedSharding, PartitionSpec as P
        import iris_jax

        def psum_step(world):
            f = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "i"), mesh=world.mesh, in_specs=P("i"), out_specs=P()))
            x = jax.device_put(jnp.ones((world.size * 8,), jnp.float32), NamedSharding(world.mesh, P("i")))
            return lambda: np.asarray(f(x))

        @pytest.mark.iris(ranks=(2, 4), timeout_s=2)
        def test_a_rank_dies(iris_world, iris_faults):
            a_rank_dies(iris_world, iris_faults)

        @pytest.mark.iris(ranks=(2, 4), timeout_s=2, detect_races=False)
        def test_a_rank_dies_without_the_detector(iris_world, iris_faults):
            a_rank_dies(iris_world, iris_faults)

        def a_rank_dies(iris_world, iris_faults):
            step = psum_step(iris_world)
            iris_faults.kill(rank=1, at_call=2)
            np.testing.assert_array_equal(step(), np.full(8, iris_world.size, np.float32))
            start = time.monotonic()
            with pytest.raises(Exception, match="simulated rank 1 died at its iris call 2 .injected by iris_faults.kill.; "
                               "its call 2, iris all_reduce.sum. of .float32.1, 8.., did not run"):
                step()
            assert time.monotonic() - start < 2 + 5
            assert iris_faults.calls(0) == 2

        @pytest.mark.iris(ranks=2, timeout_s=2)
        def test_calls_disagree(iris_world, iris_faults):
            iris_faults.disagree(rank=0)
            with pytest.raises(Exception, match="RankMismatchError") as info:
                psum_step(iris_world)()
            message = str(info.value)  # both calls named, in the order the ranks reported them
            assert ("rank 0 ran iris all_reduce(sum) of (float32[1, 8]) (rank 0's call made to differ by "
                    "iris_faults.disagree)") in message and "rank 1 ran iris all_reduce(sum)" in message, message

        @pytest.mark.iris(ranks=2, timeout_s=3)
        def test_a_rank_arrives_late(iris_world, iris_faults):
            iris_faults.delay(rank=1, seconds=1.0)
            start = time.monotonic()
            np.testing.assert_array_equal(psum_step(iris_world)(), np.full(8, 2, np.float32))
            assert time.monotonic() - start >= 1.0

        @pytest.mark.iris(ranks=2)
        def test_the_heap_runs_out(iris_world, iris_faults):
            iris_faults.exhaust_heap()
            with pytest.raises(iris_jax.HeapExhaustedError, match="exhausted by iris_faults"):
                iris_jax.zeros((16,), jnp.float32, sharding=NamedSharding(iris_world.mesh, P("i")))
        ''')
    result = _run(user, "-p", "no:randomly")
    result.assert_outcomes(passed=7)
