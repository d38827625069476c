#!/usr/bin/env bash
# bench/exec/busy_machine.sh [MEMWALL] [CONFIG] [STEPS]: `memwall run` on a machine others keep busy
# (issue 30, item 5). Each way of running is timed idle and beside `stress-ng --cpu 4`, alternately,
# in one run; prints the median step and the busy/idle ratio of each:
#   fitted        the default: host threads fitted to the cores others leave, OpenMP waiting passively
#   2 threads     --threads 2 (every core of this 2-core machine), waiting passively
#   2 spinning    --threads 2 with OMP_WAIT_POLICY=active: what memwall did before the fit
# Defaults: build/memwall, exec/data/run.yaml, 30 steps. A benchmark, not a test (run.busy_machine
# bounds the fitted ratio at 8).
set -euo pipefail
mw=${1:-build/memwall}
cfg=${2:-exec/data/run.yaml}
steps=${3:-30}
command -v stress-ng >/dev/null || { echo "stress-ng is not installed (setup.sh installs it)"; exit 1; }
median() {  # env... -- args: the run's median step in ms
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$mw" run --config "$cfg" --steps "$steps" --json "$@" 2>/dev/null |
    /usr/bin/python3 -c "import json,sys; print(f\"{json.loads(sys.stdin.read().splitlines()[-1])['iteration_s_median']*1e3:.1f}\")"
}
declare -A idle busy
ways=("fitted" "2 threads" "2 spinning")
run_way() {
  case "$1" in
    "fitted") median X=1 -- ;;
    "2 threads") median X=1 -- --threads 2 ;;
    "2 spinning") median OMP_WAIT_POLICY=active -- --threads 2 ;;
  esac
}
for w in "${ways[@]}"; do idle[$w]=$(run_way "$w"); done
stress-ng --cpu 4 --timeout 600 >/dev/null 2>&1 &
stress=$!
trap 'kill $stress 2>/dev/null; wait $stress 2>/dev/null' EXIT
sleep 1
for w in "${ways[@]}"; do busy[$w]=$(run_way "$w"); done
printf "%-12s %10s %12s %8s\n" "way" "idle ms" "busy ms" "ratio"
for w in "${ways[@]}"; do
  printf "%-12s %10s %12s %8s\n" "$w" "${idle[$w]}" "${busy[$w]}" \
    "$(/usr/bin/python3 -c "print(f'{${busy[$w]} / ${idle[$w]}:.2f}')")"
done
