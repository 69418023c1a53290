#!/usr/bin/env bash
# Installs iris-jax into ./.venv. CPU-only machines get the CPU build of torch first (small,
# no multi-GB CUDA download) and the JAX CUDA plugin that jax_triton needs to import.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q -e ".[gpu,plots]"
else
    python -m pip install -q "torch==2.13.0" || python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
    python -m pip install -q -e ".[cpu,plots]" "jax[cuda13-local]==0.10.2"
fi
