#!/usr/bin/env bash
# hostile_env.sh CASE MEMWALL: memwall where the environment, not the flags, is wrong (issue 16):
# unreadable files and folders, thread limits, a read-only filesystem, signals. Each case checks the
# tests/cli/expect.sh convention (exit code, one stderr line naming the path or flag, empty stdout,
# nothing left behind). Permission cases run as user nobody when we are root (root reads anything);
# cases that need root (mount namespaces) exit 77 (skipped) without it.
set -u
case_name=$1 MW=$2
here=$(cd "$(dirname "$0")" && pwd)
EXPECT=$here/expect.sh
work=$(mktemp -d /var/tmp/memwall-hostile.XXXXXX)
chmod 755 "$work"
cleanup() { chmod -R u+rwx "$work" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# Runs "$@" as nobody when root, so permission bits apply; as is otherwise.
as_nobody() {
  if [ "$(id -u)" = 0 ]; then setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; else "$@"; fi
}
# Thread limits only bind an unprivileged user, and RLIMIT_NPROC counts every process of that user:
# a uid of its own (65533, no account) that nothing else runs as, with RLIMIT_NPROC 4.
few_threads() {
  if [ "$(id -u)" = 0 ]; then setpriv --reuid=65533 --regid=65533 --clear-groups -- prlimit --nproc=4:4 -- "$@"
  else prlimit --nproc=4:4 -- "$@"; fi
}
need_root() { [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null || { echo "skipped: needs root and mount namespaces"; exit 77; }; }
# killed_leaves_nothing N PATTERN -- CMD...: for SIGTERM, SIGINT and SIGHUP, starts CMD, waits until
# N files matching PATTERN are in $work/scratch (and half a second more), sends the signal, and
# checks that the process died of it and left the folder empty.
killed_leaves_nothing() {
  local n=$1 pattern=$2
  shift 3
  for sig in TERM INT HUP; do
    "$@" >/dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 600); do [ "$(ls "$work/scratch" | grep -c -- "$pattern")" -ge "$n" ] && break; sleep 0.05; done
    [ "$(ls "$work/scratch" | grep -c -- "$pattern")" -ge "$n" ] || { echo "FAIL: $1 made no file: $(ls "$work/scratch")"; kill -9 $pid; exit 1; }
    sleep 0.5
    kill -$sig $pid
    wait $pid
    local rc=$?
    [ $rc -ge 128 ] || { echo "FAIL: SIG$sig: exit $rc, wanted death by signal"; exit 1; }
    [ -z "$(ls -A "$work/scratch")" ] || { echo "FAIL: SIG$sig left $(ls -A "$work/scratch")"; exit 1; }
    echo "ok: SIG$sig removed every file (exit $rc)"
  done
}
# Nothing but what the case created itself may remain in the work folder.
no_leftovers() {
  left=$(find "$work" -name 'memwall-io-bench-*' -o -name '*.memwall-*.tmp' | head -5)
  [ -z "$left" ] || { echo "FAIL: left behind: $left"; exit 1; }
}

cp "$here/fixtures/tiny_model.yaml" "$work/secret.yaml"
chmod 000 "$work/secret.yaml"
mkdir "$work/locked" && cp "$here/fixtures/tiny_model.yaml" "$work/locked/model.yaml" &&
  cp "$here/../../hardware_profiles/dgx2.yaml" "$work/locked/p.yaml" && chmod 000 "$work/locked"
mkdir -m 777 "$work/scratch"

case "$case_name" in
  unreadable_file)
    as_nobody "$EXPECT" 2 "^memwall analyze: $work/secret.yaml: cannot read the model file: permission denied$" "" \
      -- "$MW" analyze --model "$work/secret.yaml" ;;
  unreadable_folder)
    as_nobody "$EXPECT" 2 "^memwall plan: $work/locked/model.yaml: cannot read the model file: permission denied$" "" \
      -- "$MW" plan --model "$work/locked/model.yaml" ;;
  unreadable_profile)
    as_nobody "$EXPECT" 2 "^memwall schedule: $work/locked/p.yaml: cannot read the profile file: permission denied$" "" \
      -- "$MW" schedule --profile "$work/locked/p.yaml" --model table1-1T ;;
  output_in_unwritable_folder)
    mkdir -m 555 "$work/ro"
    as_nobody "$EXPECT" 2 "^memwall analyze: -o: $work/ro/out.txt: cannot be written \\(Permission denied\\)$" "" \
      --no-file "$work/ro/out.txt" -- "$MW" analyze --model fig2a-1T -o "$work/ro/out.txt" ;;
  adam_threads_refused)
    few_threads "$EXPECT" 2 "^memwall adam-bench: --threads: cannot start 16 threads: Resource temporarily unavailable$" "" \
      -- "$MW" adam-bench --threads 16 --params 1K --repeats 1 ;;
  psync_threads_refused)
    few_threads "$EXPECT" 1 "^memwall io-bench: psync engine: cannot start 64 threads \\(one per queue slot\\): Resource temporarily unavailable$" "" \
      -- "$MW" io-bench --dir "$work/scratch" --engine psync --qd 64 --size 8MiB && no_leftovers ;;
  uring_threads_refused)
    few_threads "$EXPECT" 1 "^memwall io-bench: uring engine: cannot start 8 ring threads: Resource temporarily unavailable$" "" \
      -- "$MW" io-bench --dir "$work/scratch" --rings 8 --size 8MiB && no_leftovers ;;
  read_only_filesystem)
    # io-bench --dir on a read-only mount used to die of an uncaught filesystem_error (EROFS).
    need_root
    unshare -m -- sh -c 'mount --bind -o ro "$1" "$1" && exec "$2" 2 "^memwall io-bench: --dir: $1: cannot create files there: Read-only file system$" "" -- "$3" io-bench --dir "$1" --size 8MiB' \
      sh "$work/scratch" "$EXPECT" "$MW" ;;
  read_only_output)
    need_root
    unshare -m -- sh -c 'mount --bind -o ro "$1" "$1" && exec "$2" 2 "^memwall analyze: -o: $1/out.txt: cannot be written \\(Read-only file system\\)$" "" --no-file "$1/out.txt" -- "$3" analyze -o "$1/out.txt"' \
      sh "$work/scratch" "$EXPECT" "$MW" ;;
  signal_removes_temp_file)
    # SIGTERM, SIGINT and SIGHUP while io-bench's file exists: the file goes, the process dies of the signal.
    killed_leaves_nothing 1 '' -- "$MW" io-bench --dir "$work/scratch" --size 2GiB --block 4KiB --qd 1 ;;
  signal_removes_swap_files)
    # The same while `memwall run` trains from its three swap files (zero_inf_nvme), half a second
    # into training. It used to leave all three behind.
    killed_leaves_nothing 3 '\.swap$' -- "$MW" run --config "$(cd "$here/../../exec/data" && pwd)/run.yaml" \
      --strategy zero_inf_nvme --nvme-dir "$work/scratch" --steps 100000 ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
