#!/usr/bin/env bash
# expect.sh RC STDERR_REGEX STDOUT_REGEX [--no-file PATH] -- COMMAND...
# Runs COMMAND and checks: exit code RC; on failure exactly one line on stderr matching
# STDERR_REGEX, nothing on stdout and PATH (if given) not created; on success stdout matches
# STDOUT_REGEX (extended grep, any line).
set -u
rc_want=$1 err_re=$2 out_re=$3
shift 3
no_file=""
if [ "$1" = "--no-file" ]; then no_file=$2; shift 2; rm -f "$no_file"; fi
[ "$1" = "--" ] && shift
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err"
rc=$?
fail() { echo "FAIL: $*"; echo "command: $*"; echo "--- stdout"; head -20 "$out"; echo "--- stderr"; cat "$err"; exit 1; }
[ "$rc" = "$rc_want" ] || fail "exit code $rc, wanted $rc_want"
if [ "$rc" != 0 ]; then
  [ "$(wc -l <"$err")" = 1 ] || fail "stderr is not exactly one line"
  grep -Eq -- "$err_re" "$err" || fail "stderr does not match /$err_re/"
  [ -s "$out" ] && fail "stdout not empty on error (partial output)"
  if [ -n "$no_file" ] && [ -e "$no_file" ]; then fail "$no_file was written"; fi
else
  grep -Eq -- "$out_re" "$out" || fail "stdout does not match /$out_re/"
fi
echo "ok: exit $rc"
