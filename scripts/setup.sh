#!/usr/bin/env bash
# Installs iris-jax into ./.venv (editable) with its test tools: with the `gpu` extra where GPUs are
# present; on CPU-only machines a plain install, which needs no CUDA wheel and no torch.
# IRIS_STACK=oldest|newest pins one end of the supported ranges (scripts/stacks/; CI tests both);
# unset, pip resolves the newest releases for this Python, as a user's `pip install` does.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${IRIS_VENV:-.venv}  # CI's newest-stack leg keeps its own, inside the chroot
[ -d "$VENV" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip >/dev/null
pins=()
if [ -n "${IRIS_STACK:-}" ]; then pins=(-c "scripts/stacks/${IRIS_STACK}.txt"); fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q "${pins[@]}" -e ".[gpu,test,plots]"
else
    python -m pip install -q "${pins[@]}" -e ".[test,plots]"
fi
