#!/usr/bin/env bash
# partitioned_init.sh INIT_TOOL: Sec. 7.2. zero3 keeps every state on the device, partitioned: the
# 8-layer, 512-hidden GPT's states (~400 MiB) do not fit one 160 MiB device, a quarter of them does.
# Under mpirun -np 4 each rank initialises only its shard (the device high-water mark stays within
# the capacity: no rank ever held a whole parameter outside a gathered buffer), and the assembled
# weights equal a one-rank initialisation (zero_inf_nvme, dp 1) bit for bit, as do dp 2's.
set -euo pipefail
tool=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
"$tool" "$dir/dp1" zero_inf_nvme
timeout 300 "${mpi[@]}" -np 2 "$tool" "$dir/dp2" zero_inf_nvme
timeout 300 "${mpi[@]}" -np 4 "$tool" "$dir/dp4" zero3 160
cmp "$dir/dp1" "$dir/dp2"
cmp "$dir/dp1" "$dir/dp4"
echo "assembled initial weights of dp 1, 2 (zero_inf_nvme) and 4 (zero3 on 160 MiB devices) are bit-identical"
