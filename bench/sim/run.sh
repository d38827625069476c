#!/usr/bin/env bash
# Simulator speed: wall time of `memwall simulate` for one iteration of Table 1's 20T model on
# 512 GPUs (target: under 10 s on a 2-core machine) and of the 1T model on one DGX-2, then how it
# grows with layers and with GPUs. Usage: bench/sim/run.sh [path/to/memwall]
set -euo pipefail
MW=${1:-build/memwall}
t() {  # prints wall seconds and the number of SimGrid activities of one simulation
  local start end out
  start=$(date +%s.%N)
  out=$("$MW" simulate "$@" --json)
  end=$(date +%s.%N)
  printf '%8.2f s  %8s activities  %s\n' "$(echo "$end - $start" | bc)" \
    "$(echo "$out" | sed -n 's/.*"activities": \([0-9]*\).*/\1/p')" "$*"
}
echo "== targets"
t --model table1-20T --nodes 32 --bsz 1.25 --mp 8 --place act_ckpt=cpu
t --model table1-1T --bsz 7 --place act_ckpt=cpu
echo "== layers (hidden 8K, 16 GPUs, zero_inf_nvme)"
for L in 25 50 100 200; do t --layers $L --hidden 8K --heads 64 --bsz 4 --place act_ckpt=cpu; done
echo "== GPUs (table1-1T, mp 4, bsz 5)"
for N in 4 8 16 32 64; do t --model table1-1T --nodes $N --bsz 5 --mp 4 --place act_ckpt=cpu; done
echo "== memory-centric tiling (table1-1T, 16 GPUs, tiling 8: 3x the steps)"
t --model table1-1T --bsz 14 --ci 2 --tiling 8 --place act_ckpt=cpu
