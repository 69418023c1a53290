#!/usr/bin/env bash
# Runs the test suite (CPU simulator unless -m gpu is given) from ./.venv (or $IRIS_VENV).
# JAX's own test files (tests/jax/jax_suite.py): IRIS_JAX_TESTS, else the copy beside the
# repository (../shared/jax-tests, as CI has it) at the revision of the installed jax (its
# README: jax-v0.10.2/ for jax 0.10, main-cec06d1/ for newer); without either, their suites skip.
set -uo pipefail
cd "$(dirname "$0")/.."
. "${IRIS_VENV:-.venv}/bin/activate"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
shared="$(cd .. && pwd)/shared/jax-tests"
if [ -z "${IRIS_JAX_TESTS:-}" ] && [ -d "$shared" ]; then
    case "$(python -c 'import jax; print(jax.__version__)')" in
        0.10.*) IRIS_JAX_TESTS="$shared/jax-v0.10.2" ;;
        *) IRIS_JAX_TESTS="$shared/main-cec06d1" ;;
    esac
    export IRIS_JAX_TESTS
fi
exec python -m pytest -q "$@"
