#!/usr/bin/env bash
# What we run on the GPU machine (device tool, kind nvidia-h200-x2, or nvidia-h200 for `shared`):
#   bash scripts/gpu_check.sh [shared|vmm|tests|bench|probe|all|STEP...]
# `shared` (step gpu_shared) needs one GPU: world sizes 2, 4 and 8 as processes sharing GPU 0, at most
# 360 + 90 s; `vmm` (step gpu_vmm, one GPU) the same harness at 2 and 4 ranks with each heap allocator, 240 s; `suite` (step gpu_suite) is the whole `pytest -m gpu` in one call, on one GPU the shared
# runs plus the tests of a world of one (the tests that need two or more GPUs are deselected there).
# A device call lasts at most 600 s: `tests` takes about 450 s when nothing hangs, `bench` more
# than one call, so name steps to split them (e.g. `gpu_fused gpu_examples`, `rma collectives`).
# Steps run in this file's order whatever the order of the arguments; `probe` holds quick
# looks for tuning (a collectives subset, bf16, the latency floor, the launch and GEMM sweeps,
# where a fused call's time goes).
# Uses the machine's own python3/jax/triton/torch; jax-triton comes from the carried .whl/
# (carry: [".whl"]). Every step has its own time limit so one hang cannot eat the lease;
# full logs go to $OUT. Record what it prints in benchmarks/RESULTS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${*:-all}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -c "import jax, triton, torch; print('jax', jax.__version__, 'triton', triton.__version__, 'torch', torch.__version__, jax.devices())"
step() {  # step NAME SECONDS COMMAND...: run with a limit, keep the log, print its tail
  local name=$1 limit=$2; shift 2
  case " $what " in *" $name "*|*" $group "*|*" all "*) ;; *) return ;; esac
  echo "=== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  grep -v "^E1129\|Source Location\|cuda_status.cc\|^$" "$OUT/$name.log" | tail -25
  echo "=== $name exit $rc"
}
# a hanging test dumps every thread's stack into its log (faulthandler) before the step's limit
t="python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -o faulthandler_timeout=90"
group=shared
# every process's log (and rank 0's trace of each world) in $OUT/shared_logs.tgz; the ranks dump their
# own stacks before their launcher's limit, so pytest's faulthandler waits for the whole step
shared="IRIS_GPU_LOG_DIR=/tmp/iris_shared python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider \
  -o faulthandler_timeout=560"
step gpu_shared 570 bash -c "$shared tests/gpu/test_gpu_shared.py; rc=\$?; tar czf $OUT/shared_logs.tgz \
  -C /tmp/iris_shared . 2>/dev/null; exit \$rc"
# both heap allocators (issue 22), one GPU: 2 and 4 ranks sharing GPU 0 with IRIS_HEAP_ALLOCATOR=vmm (cuMemCreate,
# POSIX-fd handles) and =malloc (cudaMalloc + CUDA IPC), kernels / device_barrier / collectives each, every process's
# runtime naming the allocator; at most 220 s (the launcher's limit); every process's log in $OUT/vmm_logs.tgz
group=vmm
step gpu_vmm 240 bash -c "IRIS_GPU_LOG_DIR=/tmp/iris_vmm python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider \
  -o faulthandler_timeout=230 tests/gpu/test_gpu_vmm.py; rc=\$?; tar czf $OUT/vmm_logs.tgz -C /tmp/iris_vmm . 2>/dev/null; \
  exit \$rc"
# the whole `pytest -m gpu` in one step (one GPU: the shared runs and the tests of a world of one, such as
# test_gpu_pallas, whose in-process JAX must not preallocate the memory that the shared runs' ranks need)
group=suite
step gpu_suite 580 bash -c "XLA_PYTHON_CLIENT_PREALLOCATE=false $shared tests/gpu; rc=\$?; tar czf \
  $OUT/suite_logs.tgz -C /tmp/iris_shared . 2>/dev/null; exit \$rc"
group=tests
step gpu_jax 120 $t tests/gpu/test_gpu_jax.py
step gpu_multi 300 $t tests/gpu/test_gpu_multiprocess.py
# domains (issue 22), two GPUs: by host (one domain), then IRIS_DOMAIN_SIZE=1 (a domain per process: no
# peer mapped, psum on NCCL, a kernel over both refused); each process prints "process P: domains OK"
step gpu_domains 260 bash -c 'for d in "" 1; do for r in 0 1; do IRIS_DOMAIN_SIZE=$d timeout 120 python3 \
  tests/gpu/domains_mp.py $r 2 2951${d:-0} & done; wait; done'
step gpu_tracing 150 $t tests/gpu/test_gpu_tracing.py
step gpu_collectives 300 $t tests/gpu/test_gpu_collectives.py
step gpu_tiles 120 $t tests/gpu/test_gpu_tiles.py
step gpu_fused 150 $t tests/gpu/test_gpu_fused.py
step gpu_examples 240 $t tests/gpu/test_gpu_examples.py
step gpu_heap_guard 120 $t tests/gpu/test_gpu_heap_guard.py  # two or more GPUs; on one: gpu_shared -k heap_guard
group=bench
step rma 120 python3 benchmarks/rma.py --mib 256
step collectives 560 python3 benchmarks/collectives.py --out "$OUT" --plot
step fused 300 python3 benchmarks/fused.py --out "$OUT" --plot
step trace_example 120 python3 examples/04_trace_all_reduce.py --out "$OUT"  # the PNG for the README
group=probe  # quick looks while tuning
# the heap guard's cost: psum at 1 KiB, 64 KiB, 16 MiB, 256 MiB with IRIS_HEAP_GUARD=1 / 0, twice each, interleaved
step guard_cost 560 python3 benchmarks/guard_cost.py time --out "$OUT/guard_cost"
# the same on ONE GPU: iris psum alone at 1 KiB, 64 KiB, 16 MiB, 2 ranks as processes sharing GPU 0, guard on / off
# twice each (the guard's relative kernel-time cost; not NVLink speed)
step guard_cost1 200 python3 benchmarks/guard_cost.py time1 --limit 45
# a trap while the host already waits: reported or hung? (the shared-GPU timeout runs; each case 40 s at most)
step trap_probe 200 bash -c 'for c in early late late_chain sync_after; do timeout 40 python3 benchmarks/trap_probe.py $c \
  || echo "$c: exit $?"; done; timeout 40 python3 benchmarks/trap_probe.py spin & sleep 3; timeout 40 python3 \
  benchmarks/trap_probe.py early; wait'
# the timeout runs alone (worlds 2, 4 and 8 at once, test_gpu_shared.py's timeout tests); a rank still running
# near the limit leaves its threads' wait channels and native stacks in $OUT/timeouts_logs.tgz (*.native)
step gpu_timeouts 200 bash -c "IRIS_GPU_SHARED_SCENARIOS=timeouts IRIS_GPU_LOG_DIR=/tmp/iris_to python3 -m pytest -m gpu \
  -q -rfE --tb=short -p no:cacheprovider tests/gpu/test_gpu_shared.py; rc=\$?; tar czf $OUT/timeouts_logs.tgz -C /tmp/iris_to .; \
  exit \$rc"
# where the first iris collective of a process goes (twice: cold, then warm Triton cache)
# (cold: a fresh kernel cache; warm: the same again; then jax-triton's own compile; then with JAX's cache)
step startup 200 bash -c "export IRIS_KERNEL_CACHE_DIR=\$(mktemp -d); S='python3 benchmarks/startup.py --processes 2 --heap-mib 384'; \
  \$S --out $OUT && \$S && IRIS_KERNEL_CACHE_DIR= \$S && \$S --jax-cache \$IRIS_KERNEL_CACHE_DIR/jax && \$S --jax-cache \$IRIS_KERNEL_CACHE_DIR/jax"
# the guard's cost on one GPU without peers: guarded load / store kernels at 64 KiB, 16 MiB, 256 MiB, on / off
step guard_rma1 200 python3 benchmarks/guard_cost.py rma1
# how this JAX picks a Pallas GPU lowering (the Mosaic GPU case of test_gpu_pallas)
step pallas_probe 60 python3 benchmarks/pallas_probe.py
# the collectives' GPU tests without their largest sizes (after a change of the small-call paths)
step gpu_small 200 $t tests/gpu/test_gpu_collectives.py \
  -k "((all_reduce and not other_algorithms) or other_collectives or ten_thousand) and not 268435459 and not 4194304"
# test_other_collectives alone (its spy: "push" mode pushes, "stream" mode streams)
step gpu_spy 150 $t tests/gpu/test_gpu_collectives.py -k other_collectives
# A/B (edit the list: TREE:SETTINGS): this tree against _ab_old, a copy of an earlier commit's iris_core,
# iris_jax and benchmarks (`git archive COMMIT iris_core iris_jax benchmarks | tar -x -C _ab_old`, listed
# in .git/info/exclude; name it in the device call's carry); run 45's list
step ab 300 bash -c 'for v in ".:" "_ab_old:" ".:IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM=1 IRIS_COLLECTIVE_STREAM_WARPS=8" \
    "_ab_old:IRIS_COLLECTIVE_PROGRAMS_PER_SM=2 IRIS_COLLECTIVE_WARPS=4" ".:" "_ab_old:"; do echo "== $v"
  env ${v#*:} python3 ${v%%:*}/benchmarks/collectives.py --out "$OUT/ab" --sizes 64K,1M,16M,64M \
    --ops psum,all_gather,psum_scatter | grep "^| [a-z]"; done'
# a streamed psum's device trace, phase by phase (4, 16, 64 MiB), one and two programs per SM (the streamed
# knobs: calls of more tiles than half the SMs take them; in runs 44-45 the general knobs did)
step timeline 120 bash -c 'for c in 1/8 2/4; do echo "== programs per SM / warps: $c"
  IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM=${c%/*} IRIS_COLLECTIVE_STREAM_WARPS=${c#*/} \
    python3 benchmarks/stream_timeline.py --out "$OUT/timeline"; done'
# streamed calls, one or two programs per SM (tile elements / programs per SM / warps)
step tune_stream2 240 python3 benchmarks/tune_collectives.py --out "$OUT/tune_stream2" \
  --cases psum:64M,all_gather:64M,psum_scatter:64M,all_to_all:64M,psum:16M,all_gather:16M \
  --configs 8192/1/8,8192/2/8,8192/2/4,4096/2/4
# mid sizes streamed (STREAM_FROM=0), one or two programs per SM (4 MiB: 128 tiles, the streamed knobs apply)
step stream_mid 150 bash -c 'for c in 1/8 2/4; do echo "== programs per SM / warps: $c"
  IRIS_COLLECTIVE_STREAM_FROM=0 IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM=${c%/*} IRIS_COLLECTIVE_STREAM_WARPS=${c#*/} \
    python3 benchmarks/collectives.py --out "$OUT/stream_mid" --sizes 1M,4M --ops psum,all_gather \
    | grep "^| [a-z]"; done'
# push and streamed buffers with G - 1 slots: 64 MiB calls stream by default
step slots 200 python3 benchmarks/collectives.py --out "$OUT/slots" --sizes 16M,64M,256M \
  --ops psum,all_gather,psum_scatter,all_to_all
# the README's table (1 GiB: runs 29 and 40)
step headline 420 python3 benchmarks/collectives.py --out "$OUT/headline" --plot \
  --sizes 1K,4K,16K,64K,256K,1M,4M,16M,64M,256M --ops psum,all_gather,psum_scatter,all_to_all,ppermute
step collectives_quick 200 python3 benchmarks/collectives.py --out "$OUT" --sizes 1K,64K,1M,16M,256M \
  --ops psum,psum:heap,all_gather,ppermute
step collectives_bf16 150 python3 benchmarks/collectives.py --out "$OUT/bf16" --dtypes bfloat16 \
  --sizes 1K,64K,1M,16M,256M --ops psum,all_gather,psum_scatter,ppermute
step floor 120 python3 benchmarks/latency_floor.py --out "$OUT"
step floor_legacy 120 env IRIS_TRITON_CALL=legacy python3 benchmarks/latency_floor.py --out "$OUT/legacy"
step floor_nograph 120 env XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 benchmarks/latency_floor.py \
  --out "$OUT/nograph"
step tune_collectives 260 python3 benchmarks/tune_collectives.py --cases psum:256M,psum:16M,ppermute:64M,psum:64K \
  --out "$OUT"
step tune_gemm 200 python3 benchmarks/tune_gemm.py
step fused_breakdown 220 python3 benchmarks/fused_breakdown.py --reduce-programs 8,16 --poll-ns 500
step fused_probe 150 python3 benchmarks/fused_probe.py  # the fused kernel piece by piece, one GPU
# mid sizes (the 1.3x target at 16-64 MiB): push vs pull, chunk cap 2/4/8 MiB or none
step mid_sizes 400 bash -c 'for p in 0 4611686018427387904; do for c in 2097152 4194304 8388608 ""; do
  echo "== IRIS_COLLECTIVE_PUSH_FROM=$p IRIS_COLLECTIVE_CHUNK_BYTES=$c"
  IRIS_COLLECTIVE_PUSH_FROM=$p IRIS_COLLECTIVE_CHUNK_BYTES=$c python3 benchmarks/collectives.py \
    --out "$OUT/mid_${p}_$c" --sizes 4M,16M,64M --ops psum,all_gather,ppermute | grep "^| [a-z]"; done; done'
# streamed push (one chunk, senders / receivers on their own programs) vs the default, 64 KiB - 16 MiB
step stream 300 bash -c 'for s in 0 ""; do echo "== IRIS_COLLECTIVE_STREAM_FROM=$s"
  IRIS_COLLECTIVE_STREAM_FROM=$s python3 benchmarks/collectives.py --out "$OUT/stream_$s" --sizes 64K,256K,1M,4M,16M \
    --ops psum,all_gather,psum_scatter,all_to_all | grep "^| [a-z]"; done'
# streamed: share of sending programs (percent)
step stream_senders 300 bash -c 'for p in 50 75 25; do echo "== IRIS_COLLECTIVE_STREAM_SENDERS=$p"
  IRIS_COLLECTIVE_STREAM_FROM=0 IRIS_COLLECTIVE_STREAM_SENDERS=$p python3 benchmarks/collectives.py \
    --out "$OUT/senders_$p" --sizes 4M,16M --ops psum,all_gather,psum_scatter,all_to_all | grep "^| [a-z]"; done'
# small calls streamed or pulled: every call of the four kinds streams (STREAM_FROM=0) or no
# small one does (STREAM_UNTIL=0)
step small_stream 200 bash -c 'for e in IRIS_COLLECTIVE_STREAM_FROM=0 IRIS_COLLECTIVE_STREAM_UNTIL=0; do echo "== $e"
  n=${e%=*}; env $e python3 benchmarks/collectives.py --out "$OUT/small_stream_${n##*_}" \
    --sizes 1K,16K,256K,1M --ops psum,psum_scatter,all_gather | grep "^| [a-z]"; done'
# large sizes, per call and the communication kernels alone (steady-state kernels)
step large 200 python3 benchmarks/collectives.py --out "$OUT/large" --sizes 64M,256M,1G --ops psum,ppermute
# the streamed kernel's launch configuration at 16 and 64 MiB (both stream by default on 2 GPUs)
step tune_stream 260 python3 benchmarks/tune_collectives.py \
  --out "$OUT/tune_stream" --cases psum:64M,all_gather:64M,psum:16M,psum:4M \
  --configs 8192/1/8,16384/1/8,16384/1/16,32768/1/16,4096/2/8,8192/2/8,16384/2/8,8192/1/8/40
