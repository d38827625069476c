#!/usr/bin/env bash
# full_filesystem.sh MEMWALL RUN_YAML MEMWALL_GUI: a real full filesystem (issue 16, item 6). As root, makes a
# 32 MiB ext4 image, loop-mounts it and fills it with 4 KiB files, then deletes every other one:
# statvfs then counts the free space (so memwall's own "does it fit" checks pass) but the free
# space is 4 KiB holes, and a file that size needs extent-tree blocks on top, which the kernel
# cannot find: fallocate fails with ENOSPC, a real one, deterministically. Checks that
#   memwall io-bench --dir MNT            (its temporary file), and
#   memwall run ... --nvme-dir MNT       (its swap files)
# stop with one line on stderr naming the file, the offset and "No space left on device", exit
# non-zero with nothing on stdout, and leave no file of theirs behind; and on the full disk
#   memwall run ... --save MNT/ckpt        (a checkpoint at the end of training), and
#   memwall-gui --export MNT/png          (five PNGs)
# stop with one line naming the file, leaving no step folder, no PNG and no temporary.
# Exit 77 (CTest SKIP_RETURN_CODE) only when not root or no loop device can be set up and mounted.
set -u
mw=$1 run_yaml=$2 gui=$3
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (mount -o loop)"; exit 77; }
command -v mkfs.ext4 >/dev/null || { echo "FAIL: mkfs.ext4 missing (e2fsprogs; setup.sh installs it)"; exit 1; }
losetup -f >/dev/null 2>&1 || { echo "SKIP: no free loop device (losetup -f)"; exit 77; }

work=$(mktemp -d /var/tmp/memwall-fullfs-XXXXXX)
mnt=$work/mnt
mounted=0
cleanup() {
  [ "$mounted" = 1 ] && umount "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$mnt"
truncate -s 32M "$work/fs.img"
mkfs.ext4 -q -F -m 0 "$work/fs.img" || { echo "FAIL: mkfs.ext4"; exit 1; }
if ! mount -o loop "$work/fs.img" "$mnt" 2>"$work/mount.err"; then
  echo "SKIP: mount -o loop failed: $(cat "$work/mount.err")"
  exit 77
fi
mounted=1

avail() { python3 -c 'import os,sys; v=os.statvfs(sys.argv[1]); print(v.f_bavail*v.f_frsize)' "$mnt"; }
# fill: 4 KiB files fill/0, fill/1, ... until the kernel says ENOSPC; prints how many fit.
# holes TARGET: deletes fill/0, fill/2, fill/4, ... until TARGET bytes are free (4 KiB holes).
# refill: writes the deleted even-numbered files again.
fs() {
  python3 - "$mnt/fill" "$@" <<'PY'
import errno, os, sys
d, what = sys.argv[1], sys.argv[2]
block = b"m" * 4096
def free():
    v = os.statvfs(d)
    return v.f_bavail * v.f_frsize
if what == "fill":
    os.makedirs(d, exist_ok=True)
    n = 0
    while True:
        try:
            with open(os.path.join(d, str(n)), "wb") as f:
                f.write(block)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            # ENOSPC at open (no room for the directory entry or inode) leaves no file to remove
            try:
                os.unlink(os.path.join(d, str(n)))
            except FileNotFoundError:
                pass
            break
        n += 1
    print(n)
elif what == "holes":
    target, i = int(sys.argv[3]), 0
    while free() < target and os.path.exists(os.path.join(d, str(i))):
        os.unlink(os.path.join(d, str(i)))
        i += 2
elif what == "refill":
    i = 0
    while os.path.exists(os.path.join(d, str(i + 1))):
        if not os.path.exists(os.path.join(d, str(i))):
            with open(os.path.join(d, str(i)), "wb") as f:
                f.write(block)
        i += 2
PY
}
fail() { echo "FAIL: $*"; echo "--- stdout"; head -20 "$work/out"; echo "--- stderr"; cat "$work/err"; exit 1; }
# Runs memwall and checks: non-zero exit, nothing on stdout, exactly one stderr line matching $1,
# and no file in the mount but the filler.
expect_enospc() {
  local re=$1
  shift
  "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  echo "\$ $* -> exit $rc"
  cat "$work/err"
  [ "$rc" != 0 ] || fail "exit code 0 on a full filesystem"
  [ -s "$work/out" ] && fail "stdout not empty"
  [ "$(wc -l <"$work/err")" = 1 ] || fail "stderr is not exactly one line"
  grep -Eq -- "$re" "$work/err" || fail "stderr does not match /$re/"
  left=$(ls -A "$mnt" | grep -Ev '^(fill|lost\+found$)')
  [ -z "$left" ] || fail "left behind in the filesystem: $left"
}

# The folders --save and --export write into exist before the disk fills (an empty folder takes a
# new empty file, the lock and the probe, without a data block).
mkdir "$mnt/ckpt" "$mnt/png"
# Fill with 4 KiB files until the kernel says ENOSPC.
n=$(fs fill) || { echo "FAIL: filling the filesystem"; exit 1; }
[ "$n" -gt 1000 ] || { echo "FAIL: only $n files fit"; exit 1; }
echo "filled with $n files of 4 KiB; $(avail) bytes free"

# Runs "$@" on the full disk and checks: non-zero exit, one stderr line matching $1, and folder $2
# empty afterwards (the checkpoint's step folder and temporaries, the PNGs, all gone).
expect_clean_failure() {
  local re=$1 folder=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  echo "\$ $* -> exit $rc"
  cat "$work/err"
  [ "$rc" != 0 ] || fail "exit code 0 on a full filesystem"
  [ "$(wc -l <"$work/err")" = 1 ] || fail "stderr is not exactly one line"
  grep -Eq -- "$re" "$work/err" || fail "stderr does not match /$re/"
  left=$(ls -A "$folder")
  [ -z "$left" ] || fail "left behind in $folder: $left"
}
fs holes $((16 << 10))  # room for the step folder, not for its files
expect_clean_failure "^memwall run: .*$mnt/ckpt/step-00000001/.*No space left on device" "$mnt/ckpt" \
  "$mw" run --config "$run_yaml" --steps 1 --save "$mnt/ckpt"
expect_clean_failure "^memwall-gui: $mnt/png/fig3a\.png: write failed at offset [0-9]+: No space left on device$" "$mnt/png" \
  env -u DISPLAY "$gui" --export "$mnt/png" --profile workstation
rmdir "$mnt/ckpt" "$mnt/png"
fs refill

# io-bench: every other block freed until 4 MiB are free, then exactly what statvfs says is asked for.
fs holes $((4 << 20))
free=$(avail)
size=$(( free / 4096 * 4096 ))
echo "io-bench: $free bytes free in 4 KiB holes, --size ${size}B"
expect_enospc "^memwall io-bench: fallocate $mnt/memwall-io-bench-[0-9]+\\.tmp: offset 0 length $size: No space left on device" \
  "$mw" io-bench --dir "$mnt" --size "${size}B" --block 4KiB --qd 4

# run: the holes filled again, what the swap files need from memwall's own check on the full
# disk, then holes freed until exactly that much is free.
fs refill
run=("$mw" run --config "$run_yaml" --steps 1 --strategy zero_inf_nvme --nvme-dir "$mnt")
"${run[@]}" >"$work/out" 2>"$work/err"
need=$(sed -n 's/.*the swap files need .* (\([0-9]*\) bytes).*/\1/p' "$work/err")
[ -n "$need" ] || fail "memwall run on a full disk did not say what the swap files need"
echo "run: the swap files need $need bytes"
fs holes "$need"
echo "run: $(avail) bytes free in 4 KiB holes"
expect_enospc "^memwall run: --nvme-dir: fallocate $mnt/rank0000\\.(param16|grad16|optim32)\\.swap: offset 0 length [0-9]+: No space left on device" \
  "${run[@]}"

# The same two commands with room (the filler removed) succeed, and still leave nothing behind.
rm -rf "$mnt/fill"
"$mw" io-bench --dir "$mnt" --size 4MiB --block 1MiB --qd 4 --verify >"$work/out" 2>"$work/err" || fail "io-bench with room"
grep -q "verified: 8.00 MiB read" "$work/out" || fail "io-bench --verify did not report what it verified"
"${run[@]}" --verify >"$work/out" 2>"$work/err" || fail "run with room"
grep -q "every block read verified" "$work/out" || fail "run --verify did not say it verified"
left=$(ls -A "$mnt" | grep -v '^lost+found$')
[ -z "$left" ] || fail "left behind after successful runs: $left"
echo "ok"
