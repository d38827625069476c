#!/usr/bin/env bash
# wait_policy.sh MEMWALL RUN_YAML: `memwall run` without OMP_WAIT_POLICY starts itself again with it
# set to passive (cli/main.cpp, start_with_settings: OpenMP reads it only when it loads, and its
# spinning threads took the cores the engine's host lanes needed) and glibc.malloc.hugetlb=1 added
# to GLIBC_TUNABLES (malloc in huge pages), the same process (the pid /proc shows keeps its name and
# arguments); a user's own setting of either is kept as given, other tunables too. The layout tests
# set both themselves so that each of their ranks starts once: this is the test of the path they
# skip.
set -euo pipefail
mw=$1
cfg=$2
# The settings a process runs with: /proc/PID/environ is the block its last exec was given, so
# without the variables it shows none until memwall has started itself again.
policy_of() {
  local pid=$1 deadline=$((SECONDS + 30))
  while [ $SECONDS -lt $deadline ]; do
    local env
    env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null || true)
    if grep -qx 'OMP_WAIT_POLICY=.*' <<<"$env" && grep -qx 'GLIBC_TUNABLES=.*' <<<"$env"; then
      echo "$(grep -x 'OMP_WAIT_POLICY=.*' <<<"$env" | head -1) $(grep -x 'GLIBC_TUNABLES=.*' <<<"$env" | head -1)"
      return 0
    fi
    sleep 0.05
  done
  echo "none after 30 s"
}
check() {  # check EXPECTED [ENV...]: starts a long run, reads its settings, stops it
  local want=$1
  shift
  env -u OMP_WAIT_POLICY -u GLIBC_TUNABLES -u MEMWALL_STARTED_AGAIN "$@" "$mw" run --config "$cfg" --steps 100000 >/dev/null 2>&1 &
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
check "OMP_WAIT_POLICY=passive GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
check "OMP_WAIT_POLICY=active GLIBC_TUNABLES=glibc.malloc.hugetlb=1" OMP_WAIT_POLICY=active
check "OMP_WAIT_POLICY=passive GLIBC_TUNABLES=glibc.malloc.hugetlb=0" GLIBC_TUNABLES=glibc.malloc.hugetlb=0
# another tunable of the user's: glibc.malloc.hugetlb=1 is added after it, and the loader leaves
# only the first in the environment (applying both; cli/main.cpp says why it starts again once only)
check "OMP_WAIT_POLICY=passive GLIBC_TUNABLES=glibc.malloc.check=0" GLIBC_TUNABLES=glibc.malloc.check=0
