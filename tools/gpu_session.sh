#!/usr/bin/env bash
# One GPU-machine call that runs several timed parts and leaves everything in $OUT/results.tgz:
#   tools/gpu_session.sh "tests:180:tests/test_library.py tests/test_routing.py" "cmd:60:python3 benchmarks/bench_dispatch.py"
# Each argument is KIND:SECONDS:WHAT; KIND is `tests` (pytest -m gpu WHAT) or `cmd` (a shell command).
set -u
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/opselect-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$LOGS/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOGS/gpu.txt"
SUMMARY=""
i=0
for part in "$@"; do
  i=$((i + 1))
  kind=${part%%:*}; rest=${part#*:}; secs=${rest%%:*}; what=${rest#*:}
  log="$LOGS/part$i.log"
  start=$(date +%s)
  echo "== part $i: $kind $what (limit ${secs}s)" | tee "$log"
  case "$kind" in
    # (eval: WHAT may quote, as in -k 'a or b')
    tests) eval "timeout -s INT $secs python3 -m pytest -q -m gpu -p no:cacheprovider $what" >> "$log" 2>&1
           line=$(tail -1 "$log");;
    cmd)   timeout -s INT "$secs" bash -c "$what" >> "$log" 2>&1
           line="rc=$? $(grep -v 'Warning\|warnings.warn' "$log" | tail -2 | tr '\n' ' ')";;
    *)     line="unknown kind";;
  esac
  # A part cut off by its time limit can leave workers (pytest-xdist, tuning's helper process)
  # running on the GPU; they would slow every later part.
  # (Patterns anchored so that they miss this script, whose arguments name the same commands.)
  pkill -KILL -f '^python3 -m pytest|^python3 benchmarks/|exec\(eval\(sys.stdin|dispatch[.]isolation_child' \
    2>/dev/null
  SUMMARY="$SUMMARY
[$i $kind $(( $(date +%s) - start ))s] $line"
  tar czf "$OUT/results.tgz" benchmarks/results "$LOGS" 2>/dev/null
done
echo "=== summary ===$SUMMARY"
