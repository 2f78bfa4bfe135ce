#!/usr/bin/env bash
# The whole test suite under load: `./dev test --all` N times in a row (default 3) while two CPU burners
# (`yes > /dev/null`) run beside it, as on a loaded CI machine. Stops at the first red run.
#   benchmarks/suite_under_load.sh [RUNS] [extra pytest arguments...]
# Prints one line per run and a summary; writes benchmarks/results/suite_under_load.json.
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
shift || true
logdir="${TMPDIR:-/tmp}/suite_under_load.$$"
mkdir -p "$logdir" benchmarks/results

yes > /dev/null & burner1=$!
yes > /dev/null & burner2=$!
trap 'kill $burner1 $burner2 2>/dev/null' EXIT

results=()
passed=0
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  ./dev test --all -p no:cacheprovider "$@" > "$logdir/run-$i.log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$logdir/run-$i.log" | tail -1 | tr -d '=' | xargs)
  echo "run $i: rc=$rc ${seconds}s  ${summary}  (log: $logdir/run-$i.log)"
  results+=("{\"run\": $i, \"rc\": $rc, \"seconds\": $seconds, \"summary\": \"$summary\"}")
  if [ "$rc" -ne 0 ]; then
    grep -E '^(FAILED|ERROR)' "$logdir/run-$i.log" | head -20
    break
  fi
  passed=$((passed + 1))
done
load=$(cut -d' ' -f1-3 /proc/loadavg)
printf '{"runs": [%s], "passed": %d, "asked": %d, "burners": 2, "cores": %d, "loadavg_at_end": "%s"}\n' \
  "$(IFS=,; echo "${results[*]}")" "$passed" "$runs" "$(nproc)" "$load" > benchmarks/results/suite_under_load.json
echo "suite_under_load: passed=$passed/$runs burners=2 cores=$(nproc)"
[ "$passed" -eq "$runs" ]
