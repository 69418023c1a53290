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
