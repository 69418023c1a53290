#!/usr/bin/env bash
# Installs iris-jax into ./.venv (editable): with the `gpu` extra where GPUs are present; on
# CPU-only machines a plain install (torch from the configured package index; install the CPU
# build of torch first to avoid the CUDA download).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q -e ".[gpu,plots]"
else
    python -m pip install -q -e ".[plots]"
fi
