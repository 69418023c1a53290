"""Exception types: one per kind of misuse, each message says how to fix it."""


class IrisError(Exception):
    """Base class of every error raised by iris."""


class HeapExhaustedError(IrisError, MemoryError):
    """The symmetric heap has no free block large enough for a request."""


class NotOnHeapError(IrisError, ValueError):
    """An array that must live on the symmetric heap does not."""


class RankMismatchError(IrisError, ValueError):
    """Ranks, devices or world sizes disagree between the caller and the runtime."""


class CrossDomainError(IrisError, ValueError):
    """A kernel's group spans ranks of different domains (their heaps cannot map each other)."""


class PeerTimeoutError(IrisError, TimeoutError):
    """A peer rank did not arrive within the configured timeout."""


class PeerFailedError(IrisError, RuntimeError):
    """A peer gave up on an earlier collective of this group (it timed out); the group's
    flags no longer agree, so every later collective of the group fails with this error."""


class RaceError(IrisError, RuntimeError):
    """The simulator's race detector (iris_jax.init(detect_races=True)) saw two ranks access one
    heap word, at least one writing, with nothing ordering them; the message names both accesses
    and the synchronization that would order them."""


class SimulatedRankError(IrisError, RuntimeError):
    """A simulated rank raised; the message carries that rank's traceback."""


class RankDivergenceWarning(UserWarning):
    """The simulator saw the ranks of a group make a call from different lines of the program
    (iris_core.sim.call_table): a collective that only some ranks make, or a rank-dependent
    branch with a collective in each arm (which GPUs run correctly)."""


class RaceWarning(UserWarning):
    """A race the simulator's detector found, with iris_jax.init(detect_races="warn") (RaceError's message)."""


class CStepWarning(UserWarning):
    """One of iris's C host steps (the simulator's hand-off, its collective meeting place, the fault
    gate) could not be built on this machine: no C compiler, a source file missing from the install,
    or a failed build. The message names the file and the Python step that runs instead (slower)."""
