#!/usr/bin/env bash
# What we run on the GPU machine (device tool): the gpu-marked tests and the RMA benchmark.
# Uses the machine's own python3/jax/triton/torch; jax-triton comes from the carried .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -c "import jax, triton, torch; print('jax', jax.__version__, 'triton', triton.__version__, 'torch', torch.__version__, jax.devices())"
python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu "$@" 2>&1 | tee "$OUT/gpu_tests.log"
echo "pytest exit: ${PIPESTATUS[0]}"
python3 benchmarks/rma.py --mib 256 2>&1 | tee "$OUT/rma.log"
