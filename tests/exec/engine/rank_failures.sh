#!/usr/bin/env bash
# rank_failures.sh MEMWALL: one rank's failure stops every rank, never a hang.
#   - ranks started with different settings (mpirun's MPMD form, ci 1 on one and 2 on the other)
#     are refused before step 0: the schedules' hashes differ (exit 2, the rank named);
#   - an I/O error on rank 1 mid-run (its parameter swap file cut to nothing under it) stops the
#     job: MPI_Abort with the rank, the file and the offset, within seconds.
set -euo pipefail
mw=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
cat >"$dir/run.yaml" <<EOF
layers: 2
hidden: 64
heads: 4
seq: 16
bsz: 2
steps: 100000
EOF
mkdir -p "$dir/swap"
set +e
out=$(timeout 120 "${mpi[@]}" -np 1 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_cpu --ci 1 --steps 3 : \
      -np 1 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_cpu --ci 2 --steps 3 2>&1)
rc=$?
set -e
[ "$rc" = 2 ] || { echo "FAIL: mismatched ranks exit $rc"; echo "$out"; exit 1; }
echo "$out" | grep -q 'rank 1 runs another model, placement, training config or schedule than rank 0' ||
  { echo "FAIL: $out"; exit 1; }
echo "mismatched ranks: refused before step 0 (exit 2)"

"${mpi[@]}" -np 2 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_nvme --nvme-dir "$dir/swap" \
  >"$dir/out.txt" 2>"$dir/err.txt" &
pid=$!
for _ in $(seq 1 300); do
  grep -q '^ *1 ' "$dir/out.txt" 2>/dev/null && break
  sleep 0.1
done
start=$(date +%s)
# cut it again and again: the optimizer's writes would grow it back before the next read otherwise
for _ in $(seq 1 500); do
  truncate -s 0 "$dir/swap/rank0001.param16.swap" 2>/dev/null || true
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
set +e
timeout 120 tail --pid="$pid" -f /dev/null
wait "$pid"
rc=$?
set -e
took=$(($(date +%s) - start))
[ "$rc" != 0 ] || { echo "FAIL: the job went on after rank 1's I/O error"; exit 1; }
grep -q 'memwall run: rank 1: step [0-9]*: step [0-9]* (fetch.nc .*): read .*rank0001.param16.swap: offset [0-9]* length [0-9]*: past the end of the file' \
  "$dir/err.txt" || { echo "FAIL: stderr:"; cat "$dir/err.txt"; exit 1; }
[ "$took" -lt 60 ] || { echo "FAIL: took $took s to stop"; exit 1; }
echo "rank 1's I/O error stopped the job in ${took} s (exit $rc): $(grep -o 'rank 1: .*' "$dir/err.txt" | head -1 | cut -c1-160)"
