#!/usr/bin/env bash
# bench/planner/run.sh [MEMWALL] [REPEATS]: how long `memwall plan` takes as a whole process, with the
# search's branch and bound (the default) against `--exhaustive` (every candidate's memory fit
# checked, and on profiles an executor runs every candidate's schedule built where the default asks
# the memory model: the search as it was before both), measured in the same run, and the process start
# alone (`memwall --help`) that both include. Median of REPEATS (default 5) wall times per command;
# prints seconds and the ratio exhaustive / default. The two plans must be the same (checked).
set -euo pipefail
mw=${1:-./build/memwall}
repeats=${2:-5}
cases=(
  "--model table1-10B"
  "--model table1-1T"
  "--model table1-10B --global-batch 512"
  "--model table1-10B --simulate-top 8"
  "--profile local-cpu --layers 8 --hidden 512 --heads 8 --seq 64 --vocab 256"
  "--profile dgx-h100 --model mixtral-8x7B --global-batch 256"
)
median_s() {  # median wall seconds of REPEATS runs of "$@" (stdout discarded)
  local times=()
  for _ in $(seq "$repeats"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > /dev/null
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'
}
chosen() { "$mw" plan "$@" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["strategy"], j["bsz"], j["ci"], j["tiling_factor"], j["mp"])'; }
start=$(median_s "$mw" --help)
printf 'process start (memwall --help): %.3f s\n' "$start"
printf '%-78s %10s %12s %7s\n' "plan" "default s" "exhaustive s" "ratio"
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  a=$(median_s "$mw" plan $c)
  # shellcheck disable=SC2086
  b=$(median_s "$mw" plan $c --exhaustive)
  # shellcheck disable=SC2086
  if [ "$(chosen $c)" != "$(chosen $c --exhaustive)" ]; then
    echo "bench/planner: plan $c: the branch and bound chose another plan than --exhaustive" >&2
    exit 1
  fi
  printf '%-78s %10.3f %12.3f %6.1fx\n' "$c" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
