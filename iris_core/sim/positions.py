"""Where a simulated rank is: what a call that timed out says of each rank that did not finish.

A kernel that waits for a peer spins on a heap word. While a kernel runs, this process keeps,
per thread, the last single word it read by an atomic or a flag load (volatile or acquiring;
`note_read`: the address, the value, how many times in a row), and the kernel's name (iris_core.sim.checks). Asked
(SIGUSR1, `install`), a rank's process writes its position: for each thread in a kernel, the
kernel, the source line it is at (the innermost line of the kernel's own code, and the device
API function it is in), and the word it kept reading, named as the race detector names memory:
whose heap, which array, which element, the value. `ask` sends the signal and reads the
answers; SimWorld's timeout (iris_core.sim.world) and the launcher's put them in their reports.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time

from iris_core.heap.shared_memory import open_heaps
from iris_core.sim.races import allocation_at, source_line

_HERE = os.path.dirname(os.path.abspath(__file__))
_DEVICE = os.path.join(os.path.dirname(_HERE), "device")
_reads: dict[int, list] = {}  # thread id -> [address, value, repeats, dtype name]
_kernels: dict[int, tuple[str, object]] = {}  # thread id -> (kernel name, its Python function's code)
ANSWER_S = 2.0  # how long `ask` waits for a rank's answer (a rank inside a C call answers when it returns)


def note_read(address: int, value, dtype) -> None:
    """Records a read of one heap word by this thread's kernel (a spin's poll, typically)."""
    me = threading.get_ident()
    last = _reads.get(me)
    if last is not None and last[0] == address and last[1] == value:
        last[2] += 1
    else:
        _reads[me] = [address, value, 1, getattr(dtype, "name", str(dtype))]


def kernel_started(name: str, code) -> None:
    _kernels[threading.get_ident()] = (name, code)
    _reads.pop(threading.get_ident(), None)


def kernel_ended() -> None:
    _kernels.pop(threading.get_ident(), None)
    _reads.pop(threading.get_ident(), None)


def _line(frame, kernel_code) -> str:
    """`file:line (function)` of the innermost frame of the kernel's own code (or code it calls
    outside iris's device API), and the device API function it is in."""
    via, found = None, None
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if frame.f_code.co_filename.startswith("<") and frame.f_code is not kernel_code:
            pass  # generated code (a dataclass's __init__ in "<string>"): no line of the user's
        elif path.startswith(_DEVICE) and found is None:  # the outermost: the device API function the kernel called
            via = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        elif not path.startswith(_HERE) and "/triton/" not in path and "/numpy/" not in path and found is None:
            found = source_line(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        if frame.f_code is kernel_code:
            found = found or source_line(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            break
        frame = frame.f_back
    return (found or "a line not found") + (f" in {via}" if via else "")


def _word(address: int) -> str:
    """Whose heap, which array and element `address` is, as far as this process knows."""
    for heap in open_heaps():
        where = heap.locate(address)
        if where is None:
            continue
        rank, offset = where
        text = f"rank {rank}'s heap at offset {offset}"
        found = allocation_at(*heap.allocation_table(), heap.allocation_names, offset)
        if found is None:
            return text
        start, _, what = found
        return f"{text}: {what} (allocated at offset {start}), byte {offset - start}"
    return f"address 0x{address:x} (not on a heap this process maps)"


def describe(frames: dict | None = None) -> list[str]:
    """This process's position: one line per thread in a kernel."""
    frames = sys._current_frames() if frames is None else frames
    lines = []
    for ident, (kernel, code) in list(_kernels.items()):
        frame = frames.get(ident)
        text = f"kernel {kernel} at {_line(frame, code) if frame is not None else 'an unknown line'}"
        read = _reads.get(ident)
        if read is not None:
            address, value, repeats, dtype = read
            times = f"{repeats} times in a row" if repeats > 1 else "once"
            text += f"; its last read of one word: {_word(address)} ({dtype}), value {value!r}, read {times}"
        lines.append(text)
    return lines or ["in no kernel (in a host step, or between calls)"]


_ANSWERS = itertools.count()


def answer(frame, answer_path: str | None = None) -> None:
    """Writes this process's position (`frame`: the main thread's, where a signal handler got
    it) to `answer_path` (a temporary name, then renamed), else to stderr."""
    frames = sys._current_frames()
    frames[threading.main_thread().ident] = frame
    if answer_path is None:
        sys.stderr.write("[iris.sim] where this rank was: " + "; ".join(describe(frames)) + "\n")
        sys.stderr.flush()
        return
    # a name per answer: a second asker's signal can run this handler again while the first writes
    partial = f"{answer_path}.{os.getpid()}.{next(_ANSWERS)}"
    with open(partial, "w") as f:
        f.write("\n".join(describe(frames)))
    os.replace(partial, answer_path)


def install(answer_path: str) -> None:
    """On SIGUSR1 this process writes its position to `answer_path` (`answer`). Call from the main
    thread."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: answer(frame, answer_path))


def _stamp(path: str) -> tuple[int, int] | None:
    """Which answer is at `path` (a new one is a new file: renamed over the old)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_mtime_ns


def ask(pids: dict[int, int], answer_path) -> dict[int, str]:
    """Each rank's position (rank -> text): signals `pids` (rank -> process id) and waits up to
    ANSWER_S for the files `answer_path(rank)`; a rank that did not answer says so."""
    before = {rank: _stamp(answer_path(rank)) for rank in pids}  # (several callers may ask at once)
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    found: dict[int, str] = {}
    deadline = time.monotonic() + ANSWER_S
    while len(found) < len(pids) and time.monotonic() < deadline:
        for rank in pids:
            if rank not in found and _stamp(answer_path(rank)) not in (None, before[rank]):
                try:
                    with open(answer_path(rank)) as f:
                        found[rank] = f.read()
                except FileNotFoundError:
                    pass
        time.sleep(0.02)
    for rank in pids:
        found.setdefault(rank, f"no answer within {ANSWER_S:g} s (inside a C call, or its process is gone)")
    return found
