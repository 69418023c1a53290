"""Every benchmark script runs its small mode (`--small`, benchmarks/small.py) here, so that a
change to a kernel's or the API's signature cannot break a script unseen between GPU sessions:
scripts that measure through JAX run a tiny correctness pass on the CPU simulator, those whose
kernels run only on GPUs compile them for sm_90."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
HELPERS = {"small.py", "user_kernels.py"}  # modules of the scripts, not scripts

# script -> its arguments besides --small (a script's first positional argument where it has one)
ARGUMENTS = {"guard_cost.py": ["ptx"], "collectives.py": ["--ops", "psum,psum:heap"]}
LIMIT_S = 240  # per script: a few seconds alone, more on a loaded machine
# scripts whose small mode compiles for sm_90: Triton's NVIDIA backend needed (not a GPU)
COMPILES = {"fused_probe.py", "guard_cost.py", "kernel_ptx.py", "rma.py", "trap_probe.py"}


def scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in HELPERS)


def test_every_script_is_run():
    """A new script needs a small mode, which the parametrization below then runs."""
    for name in scripts():
        text = (BENCHMARKS / name).read_text()
        assert "small.add_flag(" in text or "--small" in text, f"benchmarks/{name} has no --small mode"


@pytest.mark.parametrize("script", scripts())
def test_small_mode(script, tmp_path):
    if script in COMPILES:
        pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = "cpu"  # (a script that needs the simulator sets its device count itself)
    run = subprocess.run([sys.executable, str(BENCHMARKS / script), *ARGUMENTS.get(script, []), "--small"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    assert run.returncode == 0, f"benchmarks/{script} --small failed:\n{(run.stdout + run.stderr)[-6000:]}"
