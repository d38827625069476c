#!/usr/bin/env bash
# wait_policy.sh MEMWALL RUN_YAML: `memwall run` without OMP_WAIT_POLICY starts itself again with it
# set to passive (exec/backend/backend.hpp, wait_passively_in_openmp: OpenMP reads it only when it
# loads, and its spinning threads took the cores the engine's host lanes needed), the same process
# (the pid /proc shows keeps its name and arguments); a user's own setting is kept as given. The
# layout tests set it themselves so that each of their ranks starts once: this is the test of the
# path they skip.
set -euo pipefail
mw=$1
cfg=$2
# The policy a process runs with: /proc/PID/environ is the block its last exec was given, so
# without the variable it shows none until memwall has started itself again.
policy_of() {
  local pid=$1 deadline=$((SECONDS + 30))
  while [ $SECONDS -lt $deadline ]; do
    local env
    env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null || true)
    if grep -qx 'OMP_WAIT_POLICY=.*' <<<"$env"; then
      grep -x 'OMP_WAIT_POLICY=.*' <<<"$env" | head -1
      return 0
    fi
    sleep 0.05
  done
  echo "none after 30 s"
}
check() {  # check EXPECTED [ENV...]: starts a long run, reads its policy, stops it
  local want=$1
  shift
  env -u OMP_WAIT_POLICY "$@" "$mw" run --config "$cfg" --steps 100000 >/dev/null 2>&1 &
  local pid=$!
  local got
  got=$(policy_of $pid)
  local name
  name=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
  kill $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  if [ "$got" != "$want" ]; then
    echo "FAIL: expected $want, the run had $got"
    exit 1
  fi
  case "$name" in
    "$mw run --config $cfg --steps 100000 ") ;;
    *) echo "FAIL: the run started again as '$name'"; exit 1 ;;
  esac
  echo "ok: $want (pid $pid, still '$name')"
}
check OMP_WAIT_POLICY=passive
check OMP_WAIT_POLICY=active OMP_WAIT_POLICY=active
