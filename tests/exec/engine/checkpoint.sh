#!/usr/bin/env bash
# checkpoint.sh MEMWALL: checkpoints that survive offload. For states on NVMe (zero_inf_nvme), in
# CPU memory (zero_inf_cpu, 2 ranks under mpirun) and on the device (data_parallel):
#   - a run saved at step 10 and resumed continues with the losses of an unbroken run, bit for bit;
#   - a run killed (kill -9) while it writes its next checkpoint leaves the previous one loadable,
#     and resuming from it again gives the unbroken run's losses;
#   - (also mp 2 x dp 2 on NVMe, pp 2 in CPU memory and mp 2 x pp 2 on NVMe, both with the tied
#     embedding's two copies: each rank's files hold its slice, stage and shard)
#   - a checkpoint is refused by a run with another dp, mp, pp or placement, naming the field, and a
#     damaged file is refused by its checksum, a FIFO in place of a file as not a regular file.
set -euo pipefail
# memwall run starts itself again to set OMP_WAIT_POLICY=passive and glibc.malloc.hugetlb=1
# (cli/main.cpp, start_with_settings) when they are not set; set here, each of the many ranks below
# starts once (an 8-rank run: 0.81x the time).
export OMP_WAIT_POLICY=passive GLIBC_TUNABLES=glibc.malloc.hugetlb=1
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
steps: 20
lr: 3e-3
EOF
losses() { python3 -c 'import json,sys; print(" ".join(repr(s["loss"]) for s in json.loads(sys.stdin.read().splitlines()[-1])["steps"]))'; }
tail10() { tr ' ' '\n' | tail -10 | tr '\n' ' '; }

check() {  # check NAME LAUNCHER... -- FLAGS...
  local name=$1
  shift
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  local sw="$dir/swap-$name" ck="$dir/ck-$name"
  mkdir -p "$sw"
  local ref resumed again
  ref=$("${launch[@]}" "$mw" run --config "${cfg:-$dir/run.yaml}" "$@" --nvme-dir "$sw" --json | losses | tail10)
  "${launch[@]}" "$mw" run --config "${cfg:-$dir/run.yaml}" "$@" --nvme-dir "$sw" --steps 10 --save "$ck" >/dev/null
  resumed=$("${launch[@]}" "$mw" run --config "${cfg:-$dir/run.yaml}" "$@" --nvme-dir "$sw" --resume "$ck" --json | losses)
  [ "$(echo $resumed)" = "$(echo $ref)" ] || { echo "FAIL $name: resumed $resumed != $ref"; exit 1; }
  # killed while writing the step-15 checkpoint: its shards are on disk, its manifest is not
  MEMWALL_SAVE_PAUSE_S=30 "${launch[@]}" "$mw" run --config "${cfg:-$dir/run.yaml}" "$@" --nvme-dir "$sw" --resume "$ck" \
    --save "$ck" --save-every 15 >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    [ -e "$ck/step-00000015/rank0000.optim32" ] && break
    sleep 0.1
  done
  [ -e "$ck/step-00000015/rank0000.optim32" ] || { echo "FAIL $name: the step-15 save never started"; exit 1; }
  pkill -9 -f "save-every 15" || true
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ ! -e "$ck/step-00000015/manifest.json" ] || { echo "FAIL $name: the kill came too late"; exit 1; }
  [ "$(cat "$ck/latest")" = "step-00000010" ] || { echo "FAIL $name: latest is $(cat "$ck/latest")"; exit 1; }
  again=$("${launch[@]}" "$mw" run --config "${cfg:-$dir/run.yaml}" "$@" --nvme-dir "$sw" --resume "$ck" --json | losses)
  [ "$(echo $again)" = "$(echo $ref)" ] || { echo "FAIL $name: after the kill $again != $ref"; exit 1; }
  echo "$name: resumed at step 10, losses of steps 11-20 bit-identical to an unbroken run, also after kill -9 during the next save"
}

check nvme -- --strategy zero_inf_nvme
check device -- --strategy data_parallel
check cpu_dp2 "${mpi[@]}" -np 2 -- --strategy zero_inf_cpu
check nvme_mp2_dp2 "${mpi[@]}" -np 4 -- --strategy zero_inf_nvme --mp 2
check cpu_pp2 "${mpi[@]}" -np 2 -- --strategy zero_inf_cpu --pp 2 --grad-accum 2
check nvme_mp2_pp2 "${mpi[@]}" -np 4 -- --strategy zero_inf_nvme --mp 2 --pp 2 --grad-accum 2
# refusals: another dp, another placement, a damaged file
out=$("$mw" run --config "$dir/run.yaml" --strategy zero_inf_cpu --resume "$dir/ck-cpu_dp2" 2>&1 >/dev/null) && exit 1
grep -q 'manifest.json: run.dp: the checkpoint has 2, this run 1' <<<"$out" || { echo "FAIL: $out"; exit 1; }
out=$("$mw" run --config "$dir/run.yaml" --strategy zero3 --resume "$dir/ck-device" 2>&1 >/dev/null) && exit 1
grep -q 'manifest.json: run.placement: the checkpoint has' <<<"$out" || { echo "FAIL: $out"; exit 1; }
out=$(timeout 120 "${mpi[@]}" -np 2 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_nvme --nvme-dir "$dir/swap-nvme" \
  --resume "$dir/ck-nvme_mp2_dp2" 2>&1 >/dev/null) && exit 1
grep -q 'manifest.json: run.mp: the checkpoint has 2, this run 1' <<<"$out" || { echo "FAIL: $out"; exit 1; }
out=$(timeout 120 "${mpi[@]}" -np 2 "$mw" run --config "$dir/run.yaml" --strategy zero_inf_nvme --mp 2 --nvme-dir "$dir/swap-nvme" \
  --resume "$dir/ck-nvme_mp2_pp2" 2>&1 >/dev/null) && exit 1
grep -q 'manifest.json: run.pp: the checkpoint has 2, this run 1' <<<"$out" || { echo "FAIL: $out"; exit 1; }
f="$dir/ck-device/step-00000010/rank0000.optim32"
printf '\x01' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
out=$("$mw" run --config "$dir/run.yaml" --strategy data_parallel --resume "$dir/ck-device" 2>&1 >/dev/null) && exit 1
grep -q 'rank0000.optim32: checksum differs from the manifest' <<<"$out" || { echo "FAIL: $out"; exit 1; }
# a FIFO planted for a checkpoint file is refused at once, not waited on (it hung before)
for name in latest step-00000010/manifest.json step-00000010/rank0000.param16; do
  rm -rf "$dir/ck-fifo" && cp -r "$dir/ck-device" "$dir/ck-fifo" && rm "$dir/ck-fifo/$name" && mkfifo "$dir/ck-fifo/$name"
  rc=0
  out=$(timeout 60 "$mw" run --config "$dir/run.yaml" --strategy data_parallel --resume "$dir/ck-fifo" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 2 ] || { echo "FAIL: a FIFO at $name: exit $rc: $out"; exit 1; }
  grep -q "ck-fifo/$name: not a regular file" <<<"$out" || { echo "FAIL: $out"; exit 1; }
done
echo "refused: another dp, another mp, another pp, another placement, a damaged file, a FIFO (each naming the field or file)"
