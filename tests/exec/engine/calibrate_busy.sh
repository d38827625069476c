#!/usr/bin/env bash
# calibrate_busy.sh MEMWALL RUN_YAML: `memwall calibrate` (and validate) on a machine other programs keep busy (issue 30,
# item 5; before, it measured 7.8 instead of ~100 GFLOPS beside one busy process, without a word).
#   - beside `stress-ng --cpu N` (N = this machine's cores) it refuses at once (exit 2), naming the
#     load and stress-ng, and writes nothing; under mpirun -np 2 every rank refuses, none waits;
#   - with --allow-busy it measures, with the host threads the others leave (one), warns on stderr
#     and writes the load it saw into the profile;
#   - validate on the busy machine warns that its measured times include the others' share.
set -euo pipefail
mw=$1
cfg=$2
source "$(dirname "$0")/stress_lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
cores=$(nproc)
start_stress "$cores"

set +e
timeout 60 "$mw" calibrate --quick --nvme-dir "$dir" -o "$dir/p.yaml" >"$dir/out" 2>"$dir/err"
rc=$?
set -e
[ "$rc" = 2 ] || { cat "$dir/err"; fail "calibrate on a busy machine exited $rc, not 2"; }
grep -Eq '^memwall calibrate: this machine is busy: other processes kept [0-9.]+ of [0-9]+ cores? busy: .*stress-ng' \
  "$dir/err" || { cat "$dir/err"; fail "the refusal does not name the load and stress-ng"; }
grep -q -- '--allow-busy' "$dir/err" || fail "the refusal does not say how to measure anyway"
[ ! -e "$dir/p.yaml" ] || fail "a refused calibration wrote its profile"
echo "refused: $(grep 'busy' "$dir/err" | cut -c1-150)"

set +e
timeout 120 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 \
  "$mw" calibrate --quick --nvme-dir "$dir" -o "$dir/p.yaml" >"$dir/out" 2>"$dir/err"
rc=$?
set -e
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat "$dir/err"; fail "mpirun -np 2 calibrate on a busy machine exited $rc"; }
grep -q 'this machine is busy' "$dir/err" || { cat "$dir/err"; fail "no rank said why"; }
echo "mpirun -np 2: every rank refused (exit $rc)"

timeout 300 "$mw" calibrate --quick --allow-busy --nvme-dir "$dir" -o "$dir/p.yaml" >"$dir/out" 2>"$dir/err" ||
  { cat "$dir/err"; fail "calibrate --allow-busy failed"; }
grep -q '^memwall calibrate: warning: measured on a busy machine (--allow-busy), with 1 host thread: other processes kept' \
  "$dir/err" || { cat "$dir/err"; fail "no warning with the load"; }
grep -q '^# warning: measured on a busy machine' "$dir/p.yaml" || fail "the profile does not say what load it saw"
grep -q "^# Each operator's time is its median over several block iterations, each transfer's the best of several runs, with 1 host thread; while it measured" "$dir/p.yaml" ||
  fail "the profile does not say how it measured"
"$mw" simulate --profile "$dir/p.yaml" --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 256 --bsz 8 >/dev/null ||
  fail "the busy machine's profile does not load"
echo "--allow-busy: $(grep -c warning "$dir/err") warnings; $(grep '^  peak:' "$dir/p.yaml" | cut -c1-40)"

"$mw" validate --profile "$dir/p.yaml" --config "$cfg" --strategy zero_inf_cpu --steps 3 >/dev/null 2>"$dir/err" ||
  { cat "$dir/err"; fail "validate on the busy machine failed"; }
grep -q '^memwall validate: warning: while it ran, other processes kept [0-9.]* of [0-9]* cores\? busy' "$dir/err" ||
  { cat "$dir/err"; fail "validate on a busy machine does not warn"; }
echo "validate: $(grep warning "$dir/err" | cut -c1-120)"
