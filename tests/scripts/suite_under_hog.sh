#!/usr/bin/env bash
# Run the README's test command N times in a row (default 5) while two busy-loop CPU hogs keep both cores loaded,
# print each run's summary line and "N passed runs of N", exit non-zero when any run failed.  Once per release:
# waits bounded by progress, not fixed times, are what make the suite pass on a busy machine.
#   tests/scripts/suite_under_hog.sh [N]          (from the checkout's root, its venv active)
# PYTHON (default: python) names the interpreter, MEMX_HOGS (default 2) the number of hogs, MEMX_SUITE (default
# tests) what pytest runs.  A failed run's whole output is kept in a folder under $TMPDIR (its path is printed).
set -u
runs="${1:-5}"
python="${PYTHON:-python}"
hogs="${MEMX_HOGS:-2}"
suite="${MEMX_SUITE:-tests}"
case "$runs" in
  ''|*[!0-9]*|0) echo "suite_under_hog: N must be a whole number >= 1, got '$runs'" >&2; exit 2 ;;
esac
case "$hogs" in
  ''|*[!0-9]*) echo "suite_under_hog: MEMX_HOGS must be a whole number, got '$hogs'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.." || exit 2

hog_pids=()
stop_hogs() {
  for pid in "${hog_pids[@]}"; do
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  hog_pids=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM
for _ in $(seq "$hogs"); do
  "$python" -c 'while 1: pass' &
  hog_pids+=("$!")
done
echo "suite_under_hog: $hogs CPU hog(s) running (pids ${hog_pids[*]}), $runs run(s) of: $python -m pytest -q -p no:cacheprovider $suite"

passed=0
logs="$(mktemp -d "${TMPDIR:-/tmp}/suite_under_hog.XXXXXX")"
for run in $(seq "$runs"); do
  started=$(date +%s)
  log="$logs/run$run.log"
  "$python" -m pytest -q -p no:cacheprovider "$suite" >"$log" 2>&1
  status=$?
  summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|^(=+ )?no tests ran' "$log" | tail -1)"
  echo "run $run/$runs: exit $status in $(( $(date +%s) - started )) s: ${summary:-no summary line}"
  if [ "$status" -eq 0 ]; then
    passed=$((passed + 1))
    rm -f "$log"
  else
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    echo "    full output: $log"
  fi
done
rmdir "$logs" 2>/dev/null
echo "$passed passed runs of $runs"
[ "$passed" -eq "$runs" ]
