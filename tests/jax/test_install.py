"""A conventional install: `pip install .` on a CPU-only machine gives a working `import iris_jax`
(no JAX CUDA plugin needed), GPU users add the `gpu` extra, and no package index is named."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_WITHOUT_PLUGIN = """
import sys
sys.modules["jax_cuda13_plugin"] = None  # as if JAX's CUDA plugin were not installed
sys.modules["jax_plugins.xla_cuda13"] = None
import jax.numpy as jnp
import iris_jax
from iris_jax.compat import gpu_plugin_present
assert not gpu_plugin_present()
print("imported")
"""


def test_import_without_the_jax_cuda_plugin():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", _WITHOUT_PLUGIN], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "imported" in done.stdout


def test_dependencies_need_no_gpu_and_name_no_index():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any("cuda" in d for d in project["dependencies"])  # plain `pip install .` works without GPUs
    assert any("cuda" in d for d in project["optional-dependencies"]["gpu"])
    for path in ("pyproject.toml", "scripts/setup.sh", "README.md"):
        text = (ROOT / path).read_text()
        assert "--index-url" not in text and "--extra-index-url" not in text, path
    assert ".venv" in (ROOT / ".gitignore").read_text()


def _requirements(lines) -> dict:
    from packaging.requirements import Requirement

    return {Requirement(line).name: Requirement(line).specifier for line in lines}


def _pins(stack: str) -> dict:
    lines = (ROOT / "scripts" / "stacks" / f"{stack}.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def test_every_range_is_bounded_and_ci_tests_both_of_its_ends():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = _requirements(project["dependencies"])
    assert "torch" not in ranges  # CPU users get no torch (and so no CUDA wheel and no triton pin from it)
    oldest, newest = _pins("oldest"), _pins("newest")
    for name in ("jax", "jaxlib", "jax-triton", "triton"):
        spec = ranges[name]
        lower = [s.version for s in spec if s.operator == ">="]
        assert lower and any(s.operator == "<" for s in spec), f"{name}: {spec} needs both bounds"
        assert oldest[name] == lower[0] or oldest[name] == lower[0] + ".0", (name, oldest[name], spec)
        assert newest[name] in spec and oldest[name] in spec, (name, newest[name], spec)
    assert project["requires-python"] == ">=3.11,<3.14"
