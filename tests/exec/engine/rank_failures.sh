#!/usr/bin/env bash
# rank_failures.sh MEMWALL: one rank's failure stops every rank, never a hang.
#   - ranks started with different settings (mpirun's MPMD form, ci 1 on one and 2 on the other)
#     are refused before step 0: the schedules' hashes differ (exit 2, the rank named);
#   - an I/O error on rank 1 mid-run (its parameter swap file cut to nothing under it) stops the
#     job: MPI_Abort with the rank, the file and the offset, within seconds;
#   - a rank stopped with SIGSTOP stops the job within the stall limit, rank 0 naming the rank it
#     waits for, and leaves no process behind;
#   - the same in a job of mp 2 x pp 2 (4 ranks, world rank 3 stopped: stage 1's second slice): the
#     others' messages name the group of the step they wait on (its members' world ranks, or the
#     peer stage's rank) and the stopped rank.
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
wait_job() {  # the job $pid's exit code into $rc, seconds since $start into $took (at most $1 s)
  set +e
  timeout "$1" tail --pid="$pid" -f /dev/null
  wait "$pid"
  rc=$?
  set -e
  took=$(($(date +%s) - start))
}
stop_rank() {  # stop_rank R CONFIG: SIGSTOP world rank R of the job running CONFIG; its pid into $stopped
  stopped=
  for p in $(pgrep -x memwall); do
    { grep -qx "OMPI_COMM_WORLD_RANK=$1" < <(tr '\0' '\n' <"/proc/$p/environ") && grep -q "$2" "/proc/$p/cmdline" &&
      stopped=$p; } 2>/dev/null || true
  done
  [ -n "$stopped" ] || { echo "FAIL: rank $1's process not found:"; cat "$dir/err.txt"; kill "$pid"; exit 1; }
  kill -STOP "$stopped"
}
start_job() {  # start_job ARGS...: the job in the background, its pid into $pid
  # out.txt goes first: the background shell truncates it only when it gets to run, and the previous
  # job's step rows read before that would pass for this job's (the race CI hit at stop 44)
  rm -f "$dir/out.txt" "$dir/err.txt"
  "${mpi[@]}" "$@" >"$dir/out.txt" 2>"$dir/err.txt" &
  pid=$!
}
wait_first_step() {  # until the job's first step row is printed (60 s at most); fails if it is not
  for _ in $(seq 1 600); do
    grep -q '^ *1 ' "$dir/out.txt" 2>/dev/null && return
    kill -0 "$pid" 2>/dev/null || { echo "FAIL: the job ended before its first step:"; cat "$dir/err.txt"; exit 1; }
    sleep 0.1
  done
  echo "FAIL: no first step in 60 s:"; cat "$dir/out.txt" "$dir/err.txt"; kill "$pid"; exit 1
}
set +e
out=$(timeout 120 "${mpi[@]}" -np 1 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_cpu --ci 1 --steps 3 : \
      -np 1 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_cpu --ci 2 --steps 3 2>&1)
rc=$?
set -e
[ "$rc" = 2 ] || { echo "FAIL: mismatched ranks exit $rc"; echo "$out"; exit 1; }
grep -q 'rank 1 runs another model, placement, training config or schedule than rank 0' <<<"$out" ||
  { echo "FAIL: $out"; exit 1; }
echo "mismatched ranks: refused before step 0 (exit 2)"

start_job -np 2 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_nvme --nvme-dir "$dir/swap"
wait_first_step
start=$(date +%s)
# cut it again and again: the optimizer's writes would grow it back before the next read otherwise
for _ in $(seq 1 500); do
  truncate -s 0 "$dir/swap/rank0001.param16.swap" 2>/dev/null || true
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
wait_job 120
[ "$rc" != 0 ] || { echo "FAIL: the job went on after rank 1's I/O error"; exit 1; }
grep -q 'memwall run: rank 1: step [0-9]*: step [0-9]* (fetch.nc .*): read .*rank0001.param16.swap: offset [0-9]* length [0-9]*: past the end of the file' \
  "$dir/err.txt" || { echo "FAIL: stderr:"; cat "$dir/err.txt"; exit 1; }
[ "$took" -lt 60 ] || { echo "FAIL: took $took s to stop"; exit 1; }
echo "rank 1's I/O error stopped the job in ${took} s (exit $rc): $(grep -o 'rank 1: .*' "$dir/err.txt" | head -1 | cut -c1-160)"

# a rank stopped with SIGSTOP (it neither fails nor answers): the others' watchdog stops the job
# within the stall limit, naming the rank it waits for, and no process of the job is left behind
start_job -np 2 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_cpu --stall-timeout 5
wait_first_step
stop_rank 1 "$dir/run.yaml"
rank1=$stopped
start=$(date +%s)
wait_job 60
kill -CONT "$rank1" 2>/dev/null || true
[ "$rc" != 0 ] || { echo "FAIL: the job went on with rank 1 stopped"; exit 1; }
grep -q "memwall run: rank 0: .*stuck.*waiting for rank 1 (pid $rank1), stopped (SIGSTOP, or a debugger), which has entered [0-9]* collectives to this rank's [0-9]* and completed nothing for" \
  "$dir/err.txt" || { echo "FAIL: stderr:"; cat "$dir/err.txt"; exit 1; }
[ "$took" -lt 30 ] || { echo "FAIL: took $took s to stop (stall limit 5 s)"; exit 1; }
sleep 2
if kill -0 "$rank1" 2>/dev/null; then kill -9 "$rank1"; echo "FAIL: the stopped rank $rank1 was left behind"; exit 1; fi
echo "rank 1 stopped (SIGSTOP): the job stopped in ${took} s (exit $rc): $(grep -o 'waiting for rank 1 .*' "$dir/err.txt" | head -1 | cut -c1-150)"

# mp 2 x pp 2: the stopped rank is in an mp group (with world rank 2) and a pp group (with rank 1)
sed 's/^steps: 100000/steps: 100000\ntied_embeddings: false/' "$dir/run.yaml" >"$dir/run3d.yaml"
start_job -np 4 "$mw" run --config "$dir/run3d.yaml" --strategy zero_inf_cpu --mp 2 --pp 2 --grad-accum 2 \
  --stall-timeout 5
wait_first_step
stop_rank 3 "$dir/run3d.yaml"
rank3=$stopped
start=$(date +%s)
wait_job 60
kill -CONT "$rank3" 2>/dev/null || true
[ "$rc" != 0 ] || { echo "FAIL: the job went on with rank 3 stopped"; exit 1; }
[ "$took" -lt 30 ] || { echo "FAIL: took $took s to stop (stall limit 5 s)"; exit 1; }
# (under load the first watchdog to fire may be in the job-wide all-reduce of the loss, the stopped
# rank then among several it waits for: "over every rank of the job: ...; waiting for rank 0 ..., rank 3
# (pid P), stopped")
grep -E "memwall run: rank [012]: .*stuck.*(with world rank 3 \(pp group\)|over the mp group \(world ranks 2, 3\)|over world ranks [0-9, ]*3|waiting for rank 3 \(pid $rank3\), stopped|over every rank of the job: .*waiting for .*rank 3 \(pid $rank3\), stopped)" \
  "$dir/err.txt" >/dev/null || { echo "FAIL: no message names rank 3 and its group:"; cat "$dir/err.txt"; exit 1; }
sleep 2
if kill -0 "$rank3" 2>/dev/null; then kill -9 "$rank3"; echo "FAIL: the stopped rank $rank3 was left behind"; exit 1; fi
echo "mp 2 x pp 2, rank 3 stopped: the job stopped in ${took} s (exit $rc): $(grep -oE '(with world rank 3 \(pp group\)|over the mp group \(world ranks 2, 3\))' "$dir/err.txt" | sort -u | tr '\n' ';')"
