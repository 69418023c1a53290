"""What the race detector costs a user's test suite under pytest-iris (issue 69: at most 2x).

    python benchmarks/plugin_suite.py [--reps 2]

Runs `pytest benchmarks/plugin_suite examples/testing` (a tensor-parallel MLP step, collectives
checked against lax and a ten-step training loop at 2, 4 and 8 simulated ranks; the example
project's kernel ring, one test of it with a process per rank) in a fresh process, with the
markers' default (race detection on) and with `--iris-no-races`, alternating, `--reps` times each,
and prints each run's wall time (pytest's start-up and JAX's compilation included, as a user's CI
pays them) and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import small  # noqa: E402

SUITE = ["benchmarks/plugin_suite", "examples/testing"]


def _run(extra: list[str], suite: list[str]) -> float:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *extra, *suite]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    print(f"  {'with' if not extra else 'without':<8} the detector: {took:6.1f} s  ({done.stdout.strip().splitlines()[-1]})",
          flush=True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    small.add_flag(parser, "one test of the suite at 2 ranks, once each way")
    opts = parser.parse_args()
    suite = SUITE
    if opts.small:
        opts.reps, suite = 1, ["benchmarks/plugin_suite/test_user_code.py::test_collective_matches_lax[ranks=2-ppermute]"]
    on, off = [], []
    print(f"pytest {' '.join(suite)} on {os.cpu_count()} cores")
    for _ in range(opts.reps):
        on.append(_run([], suite))
        off.append(_run(["--iris-no-races"], suite))
    a, b = statistics.median(on), statistics.median(off)
    print(f"median with detection {a:.1f} s, without {b:.1f} s: {a / b:.2f}x")


if __name__ == "__main__":
    main()
