#!/usr/bin/env bash
# Runs the test suite on the newest end of the supported ranges (scripts/stacks/newest.txt:
# Python 3.13, jax 0.12, jax-triton 0.4, triton 3.9) inside a Debian 13 chroot, since the CPU
# machines and CI have only Python 3.11. Needs root (debootstrap, chroot, mounts).
#   bash scripts/newest_stack.sh [pytest args...]     (default: the whole CPU suite)
#   bash scripts/newest_stack.sh --wheel              (scripts/wheel_check.sh there instead: what users install)
# The chroot is built once into $IRIS_CHROOT (default /var/tmp/iris-trixie; a minute or two here);
# the repository is bind-mounted at /iris and its venv lives in the chroot (/opt/iris-venv).
# JAX's own test files (tests/jax/jax_suite.py): the folder $IRIS_JAX_SHARED (default
# ../shared/jax-tests beside the repository, as CI has it) is bound read-only at /jax-tests, and
# IRIS_JAX_TESTS defaults to its revision for this stack, /jax-tests/main-cec06d1; a given
# IRIS_JAX_TESTS passes through (a path inside the chroot, e.g. /iris/.jaxtests/main/tests for a
# copy at ./.jaxtests/main/tests). Without either their suites skip.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DIR=${IRIS_CHROOT:-/var/tmp/iris-trixie}
mirror() {  # the Debian mirror this machine's apt uses
    sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1
}
if [ ! -x "$DIR/usr/bin/python3.13" ]; then
    command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,gcc,libc6-dev \
        trixie "$DIR" "$(mirror || true)" >/dev/null
fi
# pip inside trusts the host's CA bundle (the chroot's own was refused here); the host's names
# resolve inside (jax.distributed's gloo transport looks up this machine's hostname)
cp /etc/ssl/certs/ca-certificates.crt "$DIR/etc/host-ca.crt"
cp /etc/hosts /etc/resolv.conf "$DIR/etc/"
# a C compiler, as users' machines have one: iris builds its C host steps with it (iris_jax/calls/c_build.py)
[ -x "$DIR/usr/bin/cc" ] || chroot "$DIR" env PATH=/usr/bin:/bin DEBIAN_FRONTEND=noninteractive \
    bash -c 'apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null'
mkdir -p "$DIR/iris" "$DIR/jax-tests"
JAX_TESTS=${IRIS_JAX_SHARED:-$(cd "$ROOT/.." && pwd)/shared/jax-tests}
cleanup() {
    for m in "$DIR/jax-tests" "$DIR/iris" "$DIR/dev/shm" "$DIR/proc"; do
        mountpoint -q "$m" && umount -l "$m"
    done
}
trap cleanup EXIT
mountpoint -q "$DIR/proc" || mount -t proc proc "$DIR/proc"
mountpoint -q "$DIR/dev/shm" || mount --bind /dev/shm "$DIR/dev/shm"  # the simulator's shared memory
mountpoint -q "$DIR/iris" || mount --bind "$ROOT" "$DIR/iris"
if [ -z "${IRIS_JAX_TESTS:-}" ] && [ -d "$JAX_TESTS/main-cec06d1" ]; then
    mountpoint -q "$DIR/jax-tests" || { mount --bind "$JAX_TESTS" "$DIR/jax-tests" &&
        mount -o remount,bind,ro "$DIR/jax-tests"; }
    IRIS_JAX_TESTS=/jax-tests/main-cec06d1
elif [ -z "${IRIS_JAX_TESTS:-}" ]; then
    echo "JAX's own test files not found at $JAX_TESTS/main-cec06d1: their suites skip"
fi
in_chroot() {
    chroot "$DIR" env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
        PIP_CERT=/etc/host-ca.crt SSL_CERT_FILE=/etc/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
        IRIS_VENV=/opt/iris-venv IRIS_STACK=newest PYTHON=python3.13 \
        ${IRIS_JAX_TESTS:+IRIS_JAX_TESTS="$IRIS_JAX_TESTS"} "$@"
}
if [ "${1:-}" = "--wheel" ]; then
    in_chroot bash -c 'cd /iris && bash scripts/wheel_check.sh'
    exit
fi
start=$(date +%s)
in_chroot bash -c 'cd /iris && bash scripts/setup.sh && . /opt/iris-venv/bin/activate &&
    python -c "import sys, jax, jaxlib, jax_triton, triton; print(\"newest stack: Python\", sys.version.split()[0],
    \"jax\", jax.__version__, \"jaxlib\", jaxlib.__version__, \"jax-triton\", jax_triton.__version__,
    \"triton\", triton.__version__)"'
echo "newest stack: installed in $(( $(date +%s) - start )) s"
status=0
in_chroot bash -c 'cd /iris && bash scripts/test.sh "$@"' -- "$@" || status=$?
exit "$status"
