#!/usr/bin/env bash
# Simulator speed: wall time of `memwall simulate` for one iteration of Table 1's 20T model on
# 512 GPUs (target: under 10 s on a 2-core machine) and of the 1T model on one DGX-2, then how it
# grows with layers and with GPUs; last, pipeline stages replayed one GPU per stage against every GPU
# (the ground truth, --full): wall time and iteration time of both, and their ratios.
# Usage: bench/sim/run.sh [path/to/memwall]
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
echo "== pipeline stages: one GPU per stage against every GPU replayed (--full), table1-50B on 128 GPUs"
pp() {  # wall seconds and iteration time of both replays, and their ratios
  local a b s0 s1 s2 ta tb
  s0=$(date +%s.%N); a=$("$MW" simulate "$@" --json); s1=$(date +%s.%N)
  b=$("$MW" simulate "$@" --full --json); s2=$(date +%s.%N)
  ta=$(echo "$a" | sed -n 's/.*"iteration_s": \([0-9.e+-]*\).*/\1/p')
  tb=$(echo "$b" | sed -n 's/.*"iteration_s": \([0-9.e+-]*\).*/\1/p')
  printf '  one per stage %6.2f s, every GPU %6.2f s: %5.1fx faster; iteration %.4g s vs %.4g s (ratio %.4f)  %s\n' \
    "$(echo "$s1 - $s0" | bc)" "$(echo "$s2 - $s1" | bc)" "$(echo "($s2 - $s1) / ($s1 - $s0)" | bc -l)" \
    "$ta" "$tb" "$(echo "$ta / $tb" | bc -l)" "$*"
}
pp --model table1-50B --nodes 8 --strategy three_d --mp 8 --pp 8 --dp 2 --bsz 1 --grad-accum 32
pp --model table1-50B --nodes 8 --strategy three_d --place act_ckpt=cpu/p --mp 4 --pp 16 --dp 2 --bsz 2 --grad-accum 64
