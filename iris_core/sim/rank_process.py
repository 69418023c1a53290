"""`python rank_process.py LAUNCHER_PID script.py [args]`: becomes `python script.py [args]`,
killed when the launcher dies (on Linux: PR_SET_PDEATHSIG, which survives the exec).

The launcher starts every rank through this file, so that a launcher killed with SIGKILL
takes its ranks along: their segments, named after the launcher's pid, are then stale for
`remove_stale_segments`, and no rank is left spinning. Run by path, not with -m: nothing of
the package is imported before the exec.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(launcher_pid: int, argv: list[str]) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
