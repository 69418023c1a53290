# The GPU machine's environment and step runner, sourced by scripts/gpu_check.sh (the GPU suite)
# and benchmarks/run.sh (the measurements); not run on its own.
#
# Uses the machine's own python3/jax/triton/torch; jax-triton comes from the carried .whl/
# (device tool: carry [".whl"]). NVLink multicast (NVLS) stays off for NCCL, as the device
# machines require. Every step has its own time limit so that one hang cannot eat the lease;
# full logs go to $OUT, each step's tail is printed. Record what it prints in
# benchmarks/RESULTS.md.
#
# A script that sources this sets `what` (the names asked for), defines a function holding its
# `group=...` and `step NAME SECONDS COMMAND...` lines, and ends with `run_steps THAT_FUNCTION`.
# A step runs when its name, its group or `all` was asked for (groups listed in `not_in_all`
# only by name); steps run in the function's order whatever the order of the names. The script
# exits 1 when a step failed (each step's own exit status is printed after its tail).

set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
export OUT=${OUT:-/tmp/out}  # also for the steps' own shells
group=
not_in_all=${not_in_all:-}
unknown_hint=${unknown_hint:-}
_known=" all "
_dry=
_failed=  # the steps that exited non-zero: run_steps's exit status says whether there were any

gpu_setup() {  # once, before the first step: jax-triton from .whl/, the topology, the versions
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=$PYTHONPATH:/tmp/site
  fi
  mkdir -p "$OUT"
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
  python3 -c "import jax, triton, torch; print('jax', jax.__version__, 'triton', triton.__version__, 'torch', torch.__version__, jax.devices())"
}

step() {  # step NAME SECONDS COMMAND...: run with a limit, keep the log, print its tail
  local name=$1 limit=$2; shift 2
  if [ -n "$_dry" ]; then _known="$_known$name $group "; return; fi
  case " $what " in
    *" $name "*|*" $group "*) ;;
    *" all "*) case " $not_in_all " in *" $group "*) return ;; esac ;;
    *) return ;;
  esac
  echo "=== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  grep -v "^E1129\|Source Location\|cuda_status.cc\|^$" "$OUT/$name.log" | tail -25
  echo "=== $name exit $rc"
  [ "$rc" -eq 0 ] || _failed="$_failed $name"
}

step_names() {  # step_names FUNCTION: the names and groups of FUNCTION's steps, one line
  _known=" all "; _dry=1; "$1"; _dry=
  echo $(echo "$_known" | tr ' ' '\n' | awk 'NF && !seen[$0]++')
}

run_steps() {  # run_steps FUNCTION: refuse names FUNCTION has no step or group for, then run them
  local known unknown="" name
  known=" $(step_names "$1") "
  for name in $what; do
    case "$known" in *" $name "*) ;; *) unknown="$unknown $name" ;; esac
  done
  if [ -n "$unknown" ]; then
    echo "no such step or group here:$unknown (known:$known)" >&2
    [ -z "$unknown_hint" ] || echo "$unknown_hint" >&2
    return 2
  fi
  gpu_setup
  "$1"
  if [ -n "$_failed" ]; then
    echo "=== failed:$_failed"
    return 1
  fi
}
