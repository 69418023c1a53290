"""The `iris_faults` fixture: faults iris names, injected on demand into a marked test's world.

    @pytest.mark.iris(ranks=4, timeout_s=3)
    def test_survives_a_dead_rank(iris_world, iris_faults):
        iris_faults.kill(rank=3, at_call=2)     # rank 3 dies at its second iris call
        step(x)                                 # the first call: every rank
        with pytest.raises(Exception, match="PeerTimeoutError"):
            step(x)                             # the survivors name rank 3

Each fault takes the path a real one takes (iris_jax._runtime.injected), on the simulator only.
"""

from __future__ import annotations


class Faults:
    """Plans faults for the runtime of the running test (a fresh plan per test)."""

    def __init__(self, runtime):
        from iris_jax._runtime.injected import FaultPlan  # lazy: pytest-iris imports nothing of JAX at its top

        self._plan = runtime.fault_plan = FaultPlan(runtime.world_size)

    def kill(self, rank: int, at_call: int = 1) -> None:
        """`rank` dies at its `at_call`-th iris call (kernel or collective): that call and every later
        one of the rank raise SimulatedRankError; its peers' calls that wait for it time out,
        naming it (PeerTimeoutError), as for a rank whose process died."""
        self._plan.add("kill", rank, at_call)

    def delay(self, rank: int, seconds: float, at_call: int = 1) -> None:
        """`rank` arrives `seconds` late at its `at_call`-th iris call (within the marker's timeout_s
        the call completes; past it the others name the rank)."""
        self._plan.add("delay", rank, at_call, seconds)

    def disagree(self, rank: int, at_call: int = 1) -> None:
        """`rank`'s `at_call`-th iris call differs from its peers' (as if it took another branch):
        the group's calls fail with RankMismatchError naming both calls."""
        self._plan.add("disagree", rank, at_call)

    def exhaust_heap(self, why: str = "exhausted by iris_faults.exhaust_heap") -> None:
        """Every later heap array allocation raises HeapExhaustedError, before anything is allocated."""
        self._plan.heap_out = why

    def calls(self, rank: int) -> int:
        """How many iris calls `rank` has made since the test began."""
        return self._plan.calls(rank)
