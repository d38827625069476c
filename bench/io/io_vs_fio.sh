#!/usr/bin/env bash
# io_vs_fio.sh DIR [SIZE] [BLOCK] [QD] [MEMWALL]
# fio (ioengine=io_uring, direct=1) and `memwall io-bench` on the same filesystem, with the same
# size, block and queue depth, in one run; prints both and io-bench/fio per phase. The target
# (issues 5 and 30) is >= 95 % of fio for sequential read and write at 1 MiB / qd 32. A benchmark, not a
# test: run it by hand on an idle machine. Defaults: 4GiB 1MiB 32 ./build/memwall. Shared or
# virtual disks drift by 10-20 % between runs, so fio and io-bench alternate for ROUNDS rounds
# (environment, default 3) and the medians are compared; every round is printed too. fio runs at its
# best: registered buffers and files (--fixedbufs --registerfiles) and, where the kernel has
# hugetlb pages free for its buffers (vm.nr_hugepages), --mem=shmhuge, as memwall's buffers ask for
# transparent huge pages; the header says which. io-bench runs twice per round, without and with
# --verify (a checksum of every 4 KiB block read).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [SIZE] [BLOCK] [QD] [MEMWALL]" >&2; exit 2; }
dir=$1 size=${2:-4GiB} block=${3:-1MiB} qd=${4:-32}
mw=${5:-$(cd "$(dirname "$0")/../.." && pwd)/build/memwall}
[ -d "$dir" ] || { echo "$0: $dir: no such directory" >&2; exit 2; }
[ -x "$mw" ] || { echo "$0: $mw: not built (cmake --build build)" >&2; exit 2; }
command -v fio >/dev/null || { echo "$0: fio not found (apt-get install fio)" >&2; exit 2; }

bytes() {  # 4GiB -> 4294967296, as memwall parses it (binary prefixes only here)
  python3 - "$1" <<'PY'
import re, sys
m = re.fullmatch(r"\s*([0-9.]+)\s*(B|KiB|MiB|GiB|TiB)\s*", sys.argv[1])
if not m: sys.exit(f"io_vs_fio.sh: expected a size like 4GiB or 1MiB, got {sys.argv[1]!r}")
print(int(float(m[1]) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(m[2])))
PY
}
size_b=$(bytes "$size") block_b=$(bytes "$block")
fio_file="$dir/fio-vs-memwall.$$.tmp"
out=$(mktemp -d)
trap 'rm -rf "$out" "$fio_file"' EXIT

need_kib=$((qd * block_b / 1024))
free_kib=$(awk '/^HugePages_Free:/ {f=$2} /^Hugepagesize:/ {s=$2} END {print f*s}' /proc/meminfo)
fio_mem=""
if [ "${free_kib:-0}" -ge "$need_kib" ]; then fio_mem="--mem=shmhuge"; fi
echo "fio: --fixedbufs --registerfiles ${fio_mem:-(no hugetlb pages free: echo N > /proc/sys/vm/nr_hugepages gives fio huge-page buffers)}" >&2
echo "filesystem: $(df -hT "$dir" | awk 'NR==2 {print $1, $2, $3}'), $dir; $size, $block blocks, queue depth $qd" >&2
rounds=${ROUNDS:-3}
for r in $(seq 1 "$rounds"); do
  for rw in write read randwrite randread; do  # write first: the read phases read what it wrote
    echo "round $r: fio $rw ..." >&2
    [ "$rw" = write ] && rm -f "$fio_file"  # a fresh file per round, as io-bench's
    fio --name="$rw" --filename="$fio_file" --ioengine=io_uring --direct=1 --rw="$rw" --bs="$block_b" \
        --size="$size_b" --iodepth="$qd" --fixedbufs --registerfiles $fio_mem --numjobs=1 --output-format=json >"$out/fio_${rw}_$r.json"
  done
  rm -f "$fio_file"
  echo "round $r: memwall io-bench ..." >&2
  "$mw" io-bench --dir "$dir" --size "$size" --block "$block" --qd "$qd" --engine uring --json >"$out/memwall_$r.json"
  echo "round $r: memwall io-bench --verify ..." >&2
  "$mw" io-bench --dir "$dir" --size "$size" --block "$block" --qd "$qd" --engine uring --verify --json \
    >"$out/verify_$r.json"
done

python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = [("seq write", "write", "write", "write_Bps"), ("seq read", "read", "read", "read_Bps"),
        ("rand write", "randwrite", "write", "rand_write_Bps"), ("rand read", "randread", "read", "rand_read_Bps")]
def load(prefix):
    return [json.load(open(f"{out}/{prefix}_{r}.json")) for r in range(1, rounds + 1)]
mw, ver = load("memwall"), load("verify")
if not all(m["direct"] for m in mw + ver):
    print("note: memwall fell back to buffered I/O on this filesystem; its numbers include the page cache")
if not all(m.get("huge_pages", False) for m in mw):
    print("note: transparent huge pages are off; memwall's buffers are 4 KiB pages")
print(f"{'phase':<11} {'fio GB/s':>9} {'io-bench':>9} {'ratio':>7} {'--verify':>9} {'ratio':>7}   "
      "per round (fio / io-bench / --verify, GB/s)")
for name, job, side, key in rows:
    fio = [json.load(open(f"{out}/fio_{job}_{r}.json"))["jobs"][0][side]["bw_bytes"] for r in range(1, rounds + 1)]
    ours, checked = [m[key] for m in mw], [m[key] for m in ver]
    f, o, v = statistics.median(fio), statistics.median(ours), statistics.median(checked)
    detail = "  ".join(f"{a / 1e9:.2f}/{b / 1e9:.2f}/{c / 1e9:.2f}" for a, b, c in zip(fio, ours, checked))
    print(f"{name:<11} {f / 1e9:9.3f} {o / 1e9:9.3f} {100 * o / f:6.1f}% {v / 1e9:9.3f} {100 * v / f:6.1f}%   {detail}")
print(f"medians of {rounds} alternating rounds; target: seq write and seq read >= 95 % of fio")
PY
