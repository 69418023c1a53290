#!/usr/bin/env bash
# The GPU suite on the GPU machine (device tool, carry [".whl"]):
#   bash scripts/gpu_check.sh [suite|shared|vmm|tests|all|STEP...]
# `suite` (steps gpu_suite and gpu_suite2, kind nvidia-h200, a device call each) is the whole
# `pytest -m gpu`: on one GPU the shared runs plus the tests of a world of one (the tests that need two
# or more GPUs are deselected there). `shared` (step gpu_shared, one GPU) runs world sizes 2, 4 and 8 as processes sharing GPU 0,
# at most 360 + 90 s; `vmm` (step gpu_vmm, one GPU) the same harness at 2 and 4 ranks with each heap
# allocator, 240 s; `tests` (kind nvidia-h200-x2) the tests that need two or more GPUs, file by file,
# about 450 s when nothing hangs. A device call lasts at most 600 s, so name steps to split a longer
# run (e.g. `gpu_fused gpu_examples`). The `subsets` steps (parts of a test file, for a change of one
# path) run only when named. `all` runs every other step (more than one device call).
# Measurements are not here: benchmarks/README.md lists them (bash benchmarks/run.sh EXPERIMENT).
what=${*:-all}
not_in_all="subsets faults5"
unknown_hint="Measurements run with: bash benchmarks/run.sh EXPERIMENT (benchmarks/README.md)."
. "$(dirname "$0")/gpu_env.sh"

# a hanging test dumps every thread's stack into its log (faulthandler) before the step's limit
t="python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -o faulthandler_timeout=90"
# every process's log (and rank 0's trace of each world) in $OUT/shared_logs.tgz; the ranks dump their
# own stacks before their launcher's limit, so pytest's faulthandler waits for the whole step
shared="IRIS_GPU_LOG_DIR=/tmp/iris_shared python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider \
  -o faulthandler_timeout=560"

suite_steps() {
  group=shared
  step gpu_shared 570 bash -c "$shared tests/gpu/test_gpu_shared.py; rc=\$?; tar czf $OUT/shared_logs.tgz \
    -C /tmp/iris_shared . 2>/dev/null; exit \$rc"
  # both heap allocators, one GPU: 2 and 4 ranks sharing GPU 0 with IRIS_HEAP_ALLOCATOR=vmm (cuMemCreate,
  # POSIX-fd handles) and =malloc (cudaMalloc + CUDA IPC), kernels / device_barrier / collectives each, every
  # process's runtime naming the allocator; at most 220 s (the launcher's limit); logs in $OUT/vmm_logs.tgz
  group=vmm
  step gpu_vmm 240 bash -c "IRIS_GPU_LOG_DIR=/tmp/iris_vmm python3 -m pytest -m gpu -q -rfE --tb=short \
    -p no:cacheprovider -o faulthandler_timeout=230 tests/gpu/test_gpu_vmm.py; rc=\$?; tar czf $OUT/vmm_logs.tgz \
    -C /tmp/iris_vmm . 2>/dev/null; exit \$rc"
  # the whole `pytest -m gpu` in two steps, a device call each (one GPU; the three worlds' scenarios at once
  # outlast one call, 2026-12-04): the first half of the shared scenarios, then the second half, the
  # timeouts and the tests of a world of one, such as test_gpu_pallas, whose in-process JAX must not
  # preallocate the memory that the shared runs' ranks need
  group=suite
  step gpu_suite 580 bash -c "IRIS_GPU_SHARED_PART=1/2 IRIS_GPU_SHARED_LIMIT=500 $shared tests/gpu/test_gpu_shared.py; \
    rc=\$?; tar czf $OUT/suite_logs.tgz -C /tmp/iris_shared . 2>/dev/null; exit \$rc"
  step gpu_suite2 580 bash -c "IRIS_GPU_SHARED_PART=2/2 IRIS_GPU_SHARED_LIMIT=400 XLA_PYTHON_CLIENT_PREALLOCATE=false \
    $shared tests/gpu --ignore=tests/gpu/test_gpu_faults.py; rc=\$?; tar czf $OUT/suite2_logs.tgz -C /tmp/iris_shared . \
    2>/dev/null; exit \$rc"
  # the fault matrix (issue 34), 2 and 4 ranks sharing GPU 0, every case its own processes, three
  # worlds at a time (IRIS_GPU_FAULT_JOBS; 1 runs them one after another); its table (`fault matrix | ...`
  # lines) goes to benchmarks/RESULTS.md; logs in $OUT/fault_logs.tgz. A run takes about 60 s (2026-12-04);
  # `gpu_faults5` (only when named) runs it five times in a row, stopping at the first failure
  group=faults
  step gpu_faults 200 bash -c "IRIS_GPU_LOG_DIR=/tmp/iris_faults $t -s tests/gpu/test_gpu_faults.py; rc=\$?; \
    tar czf $OUT/fault_logs.tgz -C /tmp/iris_faults . 2>/dev/null; exit \$rc"
  group=faults5
  step gpu_faults5 560 bash -c "for i in 1 2 3 4 5; do d=/tmp/iris_faults5/run\$i; mkdir -p \$d; IRIS_GPU_LOG_DIR=\$d \
    $t -s tests/gpu/test_gpu_faults.py > \$d/pytest.log 2>&1; rc=\$?; echo \"run \$i: exit \$rc, \$(grep -E \
    '[0-9]+ (passed|failed)' \$d/pytest.log | tail -1)\"; grep -E '^(FAILED|ERROR)' \$d/pytest.log; [ \$rc -eq 0 ] || break; \
    done; grep 'fault matrix |' /tmp/iris_faults5/run1/pytest.log; tar czf $OUT/fault_logs.tgz -C /tmp/iris_faults5 . \
    2>/dev/null; exit \$rc"
  group=tests
  step gpu_jax 120 $t tests/gpu/test_gpu_jax.py
  step gpu_multi 300 $t tests/gpu/test_gpu_multiprocess.py
  # domains, two GPUs: by host (one domain), then IRIS_DOMAIN_SIZE=1 (a domain per process: no peer
  # mapped, psum on NCCL, a kernel over both refused); each process prints "process P: domains OK"
  step gpu_domains 260 bash -c 'for d in "" 1; do for r in 0 1; do IRIS_DOMAIN_SIZE=$d timeout 120 python3 \
    tests/gpu/domains_mp.py $r 2 2951${d:-0} & done; wait; done'
  step gpu_tracing 150 $t tests/gpu/test_gpu_tracing.py
  step gpu_collectives 300 $t tests/gpu/test_gpu_collectives.py
  step gpu_tiles 120 $t tests/gpu/test_gpu_tiles.py
  step gpu_fused 150 $t tests/gpu/test_gpu_fused.py
  step gpu_examples 240 $t tests/gpu/test_gpu_examples.py
  step gpu_heap_guard 120 $t tests/gpu/test_gpu_heap_guard.py  # two or more GPUs; on one: gpu_shared -k heap_guard
  group=subsets
  # the timeout runs alone (worlds 2, 4 and 8 at once, test_gpu_shared.py's timeout tests); a rank still
  # running near the limit leaves its threads' wait channels and native stacks in $OUT/timeouts_logs.tgz
  step gpu_timeouts 200 bash -c "IRIS_GPU_SHARED_SCENARIOS=timeouts IRIS_GPU_LOG_DIR=/tmp/iris_to python3 -m pytest \
    -m gpu -q -rfE --tb=short -p no:cacheprovider tests/gpu/test_gpu_shared.py; rc=\$?; tar czf \
    $OUT/timeouts_logs.tgz -C /tmp/iris_to .; exit \$rc"
  # the collectives' GPU tests without their largest sizes (after a change of the small-call paths)
  step gpu_small 200 $t tests/gpu/test_gpu_collectives.py \
    -k "((all_reduce and not other_algorithms) or other_collectives or ten_thousand) and not 268435459 and not 4194304"
  # test_other_collectives alone (its spy: "push" mode pushes, "stream" mode streams)
  step gpu_spy 150 $t tests/gpu/test_gpu_collectives.py -k other_collectives
}

run_steps suite_steps
