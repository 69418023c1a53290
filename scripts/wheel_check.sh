#!/usr/bin/env bash
# What users install, checked as they get it (a CI step on both stacks): builds iris-jax's sdist and,
# from that sdist, its wheel; installs the wheel with the `test` and `plots` extras (example 04 plots) into a fresh venv outside the
# repository; then, from a folder holding only copies of tests/ and examples/ (no package source on
# the path), runs every example with the simulator's default settings and a cross-section of the
# suite that exercises each C step, the simulator's worker processes, the host meeting, launched
# ranks, Pallas and the race detector, all against the installed package.
#   bash scripts/wheel_check.sh     (IRIS_STACK=oldest|newest pins as scripts/setup.sh does; PYTHON names the Python)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/iris-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
pins=()
if [ -n "${IRIS_STACK:-}" ]; then pins=(-c "$ROOT/scripts/stacks/${IRIS_STACK}.txt"); fi
step() {  # step NAME COMMAND...: runs one step and prints its time
    local start=$SECONDS
    "${@:2}"
    echo "wheel check: $1 in $(( SECONDS - start )) s"
}

"${PYTHON:-python3}" -m venv "$WORK/venv"
. "$WORK/venv/bin/activate"
step "build (sdist, then the wheel from it)" bash -c "python -m pip install -q --upgrade pip >/dev/null &&
    python -m pip install -q ${pins[*]} build && python -m build -o '$WORK/dist' '$ROOT' >'$WORK/build.log' ||
    { cat '$WORK/build.log'; exit 1; }"
wheel=$(echo "$WORK"/dist/*.whl)
step "install $(basename "$wheel")" python -m pip install -q "${pins[@]}" "$wheel[test,plots]"

mkdir "$WORK/user"
cp -r tests examples pyproject.toml "$WORK/user/"
cd "$WORK/user"
python - <<'EOF'
import iris_core, iris_jax
for module in (iris_core, iris_jax):
    assert "site-packages" in module.__file__, f"{module.__name__} comes from {module.__file__}, not the wheel"
print("wheel check: iris_jax imported from", iris_jax.__file__)
EOF

examples() {  # every example as its docstring says to run it (no JAX_PLATFORMS, no XLA_FLAGS)
    local f
    for f in examples/demo.py examples/[0-9]*.py; do
        case "$f" in
            *10_fault_tolerant_training.py) set -- python -m iris_core.sim --survivors -n 4 "$f" ;;
            *) set -- python "$f" ;;
        esac
        if ! env -u JAX_PLATFORMS -u XLA_FLAGS "$@" >"$WORK/example.log" 2>&1; then
            cat "$WORK/example.log"; echo "wheel check: $f failed" >&2; return 1
        fi
        echo "  $f: $(grep -E 'OK|match|equal' "$WORK/example.log" | tail -1)"
    done
}
step "every example" examples

# The cross-section: the C steps (test_wheel's, exchange.c in test_sim, the host meeting, the fault
# gate), the worker processes (test_sim), launched ranks (the launcher's scripts), Pallas, races.
step "tests against the installed package" python -m pytest -q -p no:cacheprovider \
    tests/test_wheel.py::test_every_c_step_builds_without_a_warning \
    tests/core/test_sim.py tests/jax/test_host_collectives.py tests/jax/test_fault_gate.py \
    tests/jax/test_launched.py tests/jax/test_pallas.py \
    tests/jax/test_races.py -k "not staggered"
