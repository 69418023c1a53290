#!/usr/bin/env bash
# The measurements on the GPU machine (device tool, carry [".whl"]; kinds in benchmarks/README.md):
#   bash benchmarks/run.sh EXPERIMENT...|bench|probe|all
# benchmarks/README.md says what each experiment measures; each is one `step` line below (its
# command and time limit). `bench` makes the README's figures (rma, collectives, fused,
# trace_example: more than one device call), `probe` holds the tuning experiments. The GPU suite
# is scripts/gpu_check.sh.
what=$*
unknown_hint="GPU suite steps run with: bash scripts/gpu_check.sh STEP."
. "$(dirname "$0")/../scripts/gpu_env.sh"

experiments() {
  group=bench
  step rma 120 python3 benchmarks/rma.py --mib 256
  step collectives 560 python3 benchmarks/collectives.py --out "$OUT" --plot
  step fused 300 python3 benchmarks/fused.py --out "$OUT" --plot
  step trace_example 120 python3 examples/04_trace_all_reduce.py --out "$OUT"  # the PNG for the README
  # expert-parallel dispatch + combine per layer, iris against XLA's ragged_all_to_all (x2 or more; on one GPU a
  # world of one: correctness and the kernels' local path only)
  step moe_dispatch 300 python3 benchmarks/moe_dispatch.py --out "$OUT/moe"
  group=probe
  # what the fault gate costs a jitted step (modes off / step / call, 0-32 iris calls per step; one GPU)
  step fault_gate 200 python3 benchmarks/fault_gate.py
  # the README's collectives table but its 1 GiB column (that is `large` for psum and ppermute)
  step headline 420 python3 benchmarks/collectives.py --out "$OUT/headline" --plot \
    --sizes 1K,4K,16K,64K,256K,1M,4M,16M,64M,256M --ops psum,all_gather,psum_scatter,all_to_all,ppermute
  step collectives_bf16 150 python3 benchmarks/collectives.py --out "$OUT/bf16" --dtypes bfloat16 \
    --sizes 1K,64K,1M,16M,256M --ops psum,all_gather,psum_scatter,ppermute
  step collectives_quick 200 python3 benchmarks/collectives.py --out "$OUT" --sizes 1K,64K,1M,16M,256M \
    --ops psum,psum:heap,all_gather,ppermute
  # large sizes, per call and the communication kernels alone (steady-state kernels)
  step large 200 python3 benchmarks/collectives.py --out "$OUT/large" --sizes 64M,256M,1G --ops psum,ppermute
  # push and streamed buffers with G - 1 slots: 64 MiB calls stream by default
  step slots 200 python3 benchmarks/collectives.py --out "$OUT/slots" --sizes 16M,64M,256M \
    --ops psum,all_gather,psum_scatter,all_to_all
  # mid sizes: push vs pull, chunk cap 2/4/8 MiB or none
  step mid_sizes 400 bash -c 'for p in 0 4611686018427387904; do for c in 2097152 4194304 8388608 ""; do
    echo "== IRIS_COLLECTIVE_PUSH_FROM=$p IRIS_COLLECTIVE_CHUNK_BYTES=$c"
    IRIS_COLLECTIVE_PUSH_FROM=$p IRIS_COLLECTIVE_CHUNK_BYTES=$c python3 benchmarks/collectives.py \
      --out "$OUT/mid_${p}_$c" --sizes 4M,16M,64M --ops psum,all_gather,ppermute | grep "^| [a-z]"; done; done'
  # streamed push (one chunk, senders / receivers on their own programs) vs the default, 64 KiB - 16 MiB
  step stream 300 bash -c 'for s in 0 ""; do echo "== IRIS_COLLECTIVE_STREAM_FROM=$s"
    IRIS_COLLECTIVE_STREAM_FROM=$s python3 benchmarks/collectives.py --out "$OUT/stream_$s" \
      --sizes 64K,256K,1M,4M,16M --ops psum,all_gather,psum_scatter,all_to_all | grep "^| [a-z]"; done'
  # streamed: share of sending programs (percent)
  step stream_senders 300 bash -c 'for p in 50 75 25; do echo "== IRIS_COLLECTIVE_STREAM_SENDERS=$p"
    IRIS_COLLECTIVE_STREAM_FROM=0 IRIS_COLLECTIVE_STREAM_SENDERS=$p python3 benchmarks/collectives.py \
      --out "$OUT/senders_$p" --sizes 4M,16M --ops psum,all_gather,psum_scatter,all_to_all | grep "^| [a-z]"; done'
  # mid sizes streamed (STREAM_FROM=0), one or two programs per SM (4 MiB: 128 tiles, the streamed knobs apply)
  step stream_mid 150 bash -c 'for c in 1/8 2/4; do echo "== programs per SM / warps: $c"
    IRIS_COLLECTIVE_STREAM_FROM=0 IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM=${c%/*} IRIS_COLLECTIVE_STREAM_WARPS=${c#*/} \
      python3 benchmarks/collectives.py --out "$OUT/stream_mid" --sizes 1M,4M --ops psum,all_gather \
      | grep "^| [a-z]"; done'
  # small calls streamed or pulled: every call of the four kinds streams (STREAM_FROM=0) or no
  # small one does (STREAM_UNTIL=0)
  step small_stream 200 bash -c 'for e in IRIS_COLLECTIVE_STREAM_FROM=0 IRIS_COLLECTIVE_STREAM_UNTIL=0; do echo "== $e"
    n=${e%=*}; env $e python3 benchmarks/collectives.py --out "$OUT/small_stream_${n##*_}" \
      --sizes 1K,16K,256K,1M --ops psum,psum_scatter,all_gather | grep "^| [a-z]"; done'
  # a streamed psum's device trace, phase by phase (4, 16, 64 MiB), one and two programs per SM (the
  # streamed knobs: calls of more tiles than half the SMs take them)
  step timeline 120 bash -c 'for c in 1/8 2/4; do echo "== programs per SM / warps: $c"
    IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM=${c%/*} IRIS_COLLECTIVE_STREAM_WARPS=${c#*/} \
      python3 benchmarks/stream_timeline.py --out "$OUT/timeline"; done'
  # the collective kernel's launch configuration (tile elements / programs per SM / warps)
  step tune_collectives 260 python3 benchmarks/tune_collectives.py --cases psum:256M,psum:16M,ppermute:64M,psum:64K \
    --out "$OUT"
  # the streamed kernel's launch configuration at 16 and 64 MiB (both stream by default on 2 GPUs)
  step tune_stream 260 python3 benchmarks/tune_collectives.py \
    --out "$OUT/tune_stream" --cases psum:64M,all_gather:64M,psum:16M,psum:4M \
    --configs 8192/1/8,16384/1/8,16384/1/16,32768/1/16,4096/2/8,8192/2/8,16384/2/8,8192/1/8/40
  # streamed calls, one or two programs per SM (tile elements / programs per SM / warps)
  step tune_stream2 240 python3 benchmarks/tune_collectives.py --out "$OUT/tune_stream2" \
    --cases psum:64M,all_gather:64M,psum_scatter:64M,all_to_all:64M,psum:16M,all_gather:16M \
    --configs 8192/1/8,8192/2/8,8192/2/4,4096/2/4
  # A/B (edit the list: TREE:SETTINGS): this tree against _ab_old, a copy of an earlier commit's iris_core,
  # iris_jax and benchmarks (`git archive COMMIT iris_core iris_jax benchmarks | tar -x -C _ab_old`, listed
  # in .git/info/exclude; name it in the device call's carry); the list as last used: the streamed knobs
  # against the general ones
  step ab 300 bash -c 'for v in ".:" "_ab_old:" ".:IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM=1 IRIS_COLLECTIVE_STREAM_WARPS=8" \
      "_ab_old:IRIS_COLLECTIVE_PROGRAMS_PER_SM=2 IRIS_COLLECTIVE_WARPS=4" ".:" "_ab_old:"; do echo "== $v"
    env ${v#*:} python3 ${v%%:*}/benchmarks/collectives.py --out "$OUT/ab" --sizes 64K,1M,16M,64M \
      --ops psum,all_gather,psum_scatter | grep "^| [a-z]"; done'
  # where a small collective's time goes, layer by layer: as launched by default, host-launched (legacy), and
  # with XLA's command buffers (CUDA graphs) off
  step floor 120 python3 benchmarks/latency_floor.py --out "$OUT"
  step floor_legacy 120 env IRIS_TRITON_CALL=legacy python3 benchmarks/latency_floor.py --out "$OUT/legacy"
  step floor_nograph 120 env XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 benchmarks/latency_floor.py \
    --out "$OUT/nograph"
  step tune_gemm 200 python3 benchmarks/tune_gemm.py
  step fused_breakdown 220 python3 benchmarks/fused_breakdown.py --reduce-programs 8,16 --poll-ns 500
  step fused_probe 150 python3 benchmarks/fused_probe.py  # the fused kernel piece by piece, one GPU
  # the heap guard's cost: psum at 1 KiB, 64 KiB, 16 MiB, 256 MiB with IRIS_HEAP_GUARD=1 / 0, twice each,
  # interleaved
  step guard_cost 560 python3 benchmarks/guard_cost.py time --out "$OUT/guard_cost"
  # the same on ONE GPU: iris psum alone at 1 KiB, 64 KiB, 16 MiB, 2 ranks as processes sharing GPU 0, guard
  # on / off twice each (the guard's relative kernel-time cost; not NVLink speed)
  step guard_cost1 200 python3 benchmarks/guard_cost.py time1 --limit 45
  # the guard's cost on one GPU without peers: guarded load / store kernels at 64 KiB, 16 MiB, 256 MiB, on / off
  step guard_rma1 200 python3 benchmarks/guard_cost.py rma1
  # a trap while the host already waits: reported or hung? (the shared-GPU timeout runs; each case 40 s at most)
  step trap_probe 200 bash -c 'for c in early late late_chain sync_after; do timeout 40 python3 benchmarks/trap_probe.py $c \
    || echo "$c: exit $?"; done; timeout 40 python3 benchmarks/trap_probe.py spin & sleep 3; timeout 40 python3 \
    benchmarks/trap_probe.py early; wait'
  # where the first iris collective of a process goes (cold: a fresh kernel cache; warm: the same again;
  # then jax-triton's own compile; then with JAX's cache, twice)
  step startup 200 bash -c "export IRIS_KERNEL_CACHE_DIR=\$(mktemp -d); S='python3 benchmarks/startup.py --processes 2 \
    --heap-mib 384'; \$S --out $OUT && \$S && IRIS_KERNEL_CACHE_DIR= \$S && \$S --jax-cache \$IRIS_KERNEL_CACHE_DIR/jax \
    && \$S --jax-cache \$IRIS_KERNEL_CACHE_DIR/jax"
  # how this JAX picks a Pallas GPU lowering (the Mosaic GPU case of test_gpu_pallas)
  step pallas_probe 60 python3 benchmarks/pallas_probe.py
}

if [ -z "$what" ]; then
  echo "usage: bash benchmarks/run.sh EXPERIMENT... (what each measures: benchmarks/README.md)" >&2
  echo "experiments and groups: $(step_names experiments)" >&2
  exit 2
fi
run_steps experiments
