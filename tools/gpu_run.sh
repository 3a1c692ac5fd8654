#!/usr/bin/env bash
# One call on the lent GPU machine (see README, "Development"): set up, run the named parts, and
# leave logs plus benchmarks/results/ in $OUT/results.tgz (the machine returns few files).
#
#   tools/gpu_run.sh tests                   the tests marked gpu (all ops)
#   tools/gpu_run.sh tests:isin bench:isin   one op's gpu tests, one benchmark
#   tools/gpu_run.sh dispatch calibrate      the hot-path benchmark; fit the cost model constants
#
# The machine has torch and triton but not pydantic/diskcache: carry .whl (shared/gpu/fetch-wheels.sh).
set -u
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/opselect-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$LOGS/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOGS/gpu.txt"
SUMMARY=""
for part in "$@"; do
  start=$(date +%s)
  case "$part" in
    tests)
      timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -m gpu tests -p no:cacheprovider \
        > "$LOGS/tests.log" 2>&1
      line=$(tail -1 "$LOGS/tests.log");;
    tests:*)
      op=${part#tests:}
      timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu "tests/test_$op.py" \
        -p no:cacheprovider > "$LOGS/tests_$op.log" 2>&1
      line=$(tail -1 "$LOGS/tests_$op.log");;
    bench:*)
      op=${part#bench:}
      timeout "${BENCH_TIMEOUT:-420}" python3 "benchmarks/bench_$op.py" ${BENCH_ARGS:-} \
        > "$LOGS/bench_$op.log" 2>&1
      line=$(grep -E "targets_met|auto-warm_geomean_speedup_vs_torch" "$LOGS/bench_$op.log" | tr '\n' ' ');;
    dispatch)
      timeout 120 python3 benchmarks/bench_dispatch.py > "$LOGS/dispatch.log" 2>&1
      line=$(tail -6 "$LOGS/dispatch.log" | tr '\n' ' ');;
    calibrate)
      timeout 300 python3 -m opselect.cli calibrate > "$LOGS/calibrate.log" 2>&1
      python3 -m opselect.cli export "$LOGS/calibration-export.json" >> "$LOGS/calibrate.log" 2>&1
      line=$(tail -3 "$LOGS/calibrate.log" | tr '\n' ' ');;
    *)
      line="unknown part";;
  esac
  SUMMARY="$SUMMARY
[$part $(( $(date +%s) - start ))s] $line"
done
tar czf "$OUT/results.tgz" benchmarks/results "$LOGS" 2>/dev/null
echo "=== summary ===$SUMMARY"
