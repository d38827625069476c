#!/usr/bin/env bash
# bench/fuzz/run.sh [SECONDS] [BUILD]: the fuzzing benchmark of issue 16: every libFuzzer target of
# tests/fuzz for SECONDS each (default 600: ten minutes), two at a time, from the seed corpus, in
# BUILD (default build-fuzz, the clang folder `./setup.sh test` makes). Prints per target the
# executions, executions per second, new corpus units and any finding (its reproducer stays in
# BUILD/bench-fuzz/TARGET/). The reference is the CI's 60 s run of the same target: the ratio of
# new units says whether the long run still finds new paths.
set -u
seconds=${1:-600}
build=${2:-build-fuzz}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
targets="fuzz_profile fuzz_model fuzz_placement fuzz_plan fuzz_run_config fuzz_units"
for t in $targets; do
  [ -x "$build/tests/fuzz/$t" ] || { echo "bench/fuzz: $build/tests/fuzz/$t missing (run ./setup.sh test first)" >&2; exit 2; }
done
out=$build/bench-fuzz
rm -rf "$out"
mkdir -p "$out"
run_one() {
  local t=$1
  local seeds=$root/tests/fuzz/seeds/${t#fuzz_}
  bash "$root/tests/fuzz/run_fuzz.sh" "$build/tests/fuzz/$t" "$seconds" "$seeds" "$out/$t" > "$out/$t.summary" 2>&1
  echo $? > "$out/$t.rc"
}
set -- $targets
while [ $# -gt 0 ]; do
  run_one "$1" &
  [ $# -gt 1 ] && run_one "$2" &
  wait
  shift; [ $# -gt 0 ] && shift
done
status=0
printf "%-16s %12s %10s %9s  %s\n" target executions "exec/s" "new units" result
for t in $targets; do
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$out/$t.summary" | grep -o '[0-9]*$')
  units=$(grep -o 'stat::new_units_added: [0-9]*' "$out/$t.summary" | grep -o '[0-9]*$')
  rc=$(cat "$out/$t.rc")
  [ "$rc" = 0 ] && res="no finding" || { res="FINDING: see $out/$t/"; status=1; }
  printf "%-16s %12s %10s %9s  %s\n" "$t" "${execs:-?}" "$(( ${execs:-0} / seconds ))" "${units:-?}" "$res"
done
exit $status
