#!/usr/bin/env bash
# require_cuda.sh PROGRAM [ARGS...]: a device test program run twice over its cuda tests. Without
# MEMWALL_REQUIRE_CUDA it may skip them only for an absent device; with MEMWALL_REQUIRE_CUDA=1 (what
# bench/gpu/run.sh sets) a missing device must fail them, never skip (issue 29). On a machine with a
# GPU both runs must pass.
set -uo pipefail
out=$("$@" 2>&1)
rc=$?
if ! grep -q "no CUDA device" <<< "$out"; then  # a device is here: the tests must pass, and with the variable too
  [ $rc -eq 0 ] || { echo "$out" | tail -n 30; echo "require_cuda.sh: failed with a device present"; exit 1; }
  MEMWALL_REQUIRE_CUDA=1 "$@" > /dev/null 2>&1 || { echo "require_cuda.sh: failed with MEMWALL_REQUIRE_CUDA=1"; exit 1; }
  echo "require_cuda.sh: a device is present; passed both ways"
  exit 0
fi
[ $rc -eq 0 ] || { echo "$out" | tail -n 30; echo "require_cuda.sh: failed without a device (it should skip)"; exit 1; }
grep -q "SKIPPED" <<< "$out" || { echo "require_cuda.sh: no device, yet nothing skipped"; exit 1; }
req=$(MEMWALL_REQUIRE_CUDA=1 "$@" 2>&1)
rc=$?
if [ $rc -eq 0 ]; then
  echo "$req" | tail -n 20
  echo "require_cuda.sh: with MEMWALL_REQUIRE_CUDA=1 and no device the cuda tests passed or skipped: they must fail"
  exit 1
fi
if grep -q "SKIPPED" <<< "$req"; then
  echo "$req" | grep -B2 "SKIPPED" | head -n 20
  echo "require_cuda.sh: with MEMWALL_REQUIRE_CUDA=1 a test still skipped"
  exit 1
fi
failed=$(grep -c '^\[  FAILED  \].*/cuda' <<< "$req")
echo "require_cuda.sh: no device here: skipped without MEMWALL_REQUIRE_CUDA, $failed cuda test(s) failed with it"
