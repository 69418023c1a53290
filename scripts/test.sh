#!/usr/bin/env bash
# Runs the test suite (CPU simulator unless -m gpu is given) from ./.venv (or $IRIS_VENV).
set -uo pipefail
cd "$(dirname "$0")/.."
. "${IRIS_VENV:-.venv}/bin/activate"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
exec python -m pytest -q "$@"
