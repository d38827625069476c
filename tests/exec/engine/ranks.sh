#!/usr/bin/env bash
# ranks.sh MEMWALL [--clip N] [PLACEMENTS...]: data-parallel ranks under mpirun (OpenMPI; as root it needs
# --allow-run-as-root, and 4 ranks on 2 cores --oversubscribe). With the global batch fixed at 4
# sequences, dp 1, 2 and 4, and dp 2 accumulating 2 micro-steps of 1 sequence ("2a": gradients
# reduced, offloaded and added in every micro-step), train the same GPT for 20 steps with the same
# losses within 1e-5 relative (fp32: the sums differ from one rank's only in order), for
# every placement given (default: every preset the engine executes and the broadcast variant with
# partitioned parameters), and every rank's bytes per link class equal its own schedule's.
# --clip N: gradients clipped at global norm N (grad_clip), each step's norm also equal to dp 1's
# within 1e-5 (each rank sums its partition, the sums are exchanged over dp), and some steps clipped.
set -euo pipefail
# memwall run starts itself again to set OMP_WAIT_POLICY=passive and glibc.malloc.hugetlb=1
# (cli/main.cpp, start_with_settings) when they are not set; set here, each of the many ranks below
# starts once (an 8-rank run: 0.81x the time).
export OMP_WAIT_POLICY=passive GLIBC_TUNABLES=glibc.malloc.hugetlb=1
mw=$1
shift
clip=0
if [ "${1:-}" = --clip ]; then
  clip=$2
  shift 2
fi
placements=("$@")
here=$(cd "$(dirname "$0")" && pwd)
[ ${#placements[@]} -gt 0 ] || placements=(data_parallel zero2 zero_offload zero3 zero_inf_cpu zero_inf_nvme l2l
                                           "$here/fixtures/zero_inf_cpu_broadcast.yaml"
                                           "$here/fixtures/zero_inf_nvme_broadcast.yaml")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
for dp in 1 2 4; do
  cat >"$dir/run$dp.yaml" <<EOF
layers: 2
hidden: 64
heads: 4
seq: 16
bsz: $((4 / dp))
steps: 20
lr: 3e-3
precision: fp32
grad_clip: $clip
EOF
done
sed 's/^bsz: .*/bsz: 1/' "$dir/run2.yaml" >"$dir/run2a.yaml"
for p in "${placements[@]}"; do
  tag=$(basename "$p" .yaml)
  for dp in 1 2 4 2a; do
    mkdir -p "$dir/swap$dp"
    extra=()
    [ "$dp" = 2a ] && extra=(--grad-accum 2)
    if [ "$dp" = 1 ]; then
      "$mw" run --config "$dir/run$dp.yaml" --strategy "$p" --nvme-dir "$dir/swap$dp" --json >"$dir/$tag.$dp.json"
    else
      timeout 300 "${mpi[@]}" -np "${dp%a}" "$mw" run --config "$dir/run$dp.yaml" --strategy "$p" \
        --nvme-dir "$dir/swap$dp" "${extra[@]}" --json >"$dir/$tag.$dp.json"
    fi
  done
done
export HERE="$here"
tags=()
for p in "${placements[@]}"; do tags+=("$(basename "$p" .yaml)"); done
python3 - "$dir" "$clip" "${tags[@]}" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["HERE"])
from layout_check import compare
d, clip, placements = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
bad = []
for p in placements:
    runs = {dp: json.loads(open(f"{d}/{p}.{dp}.json").read().splitlines()[-1]) for dp in ("1", "2", "4", "2a")}
    ref = [s["loss"] for s in runs["1"]["steps"]]
    ref_norms = [s.get("grad_norm") for s in runs["1"]["steps"]]
    if clip > 0 and not any(n > clip for n in ref_norms):
        bad.append(f"{p}: no step's norm {ref_norms} is above {clip}: nothing clipped")
    worst = 0.0
    for dp in ("2", "4", "2a"):
        j = runs[dp]
        assert j["dp"] == int(dp[0]), (p, dp, j["dp"])
        assert j["grad_accum"] == (2 if dp == "2a" else 1) and j["global_batch"] == 4, (p, dp, j["grad_accum"])
        worst = max(worst, compare(runs["1"], j, f"{p} dp {dp}", bad, ("loss", "grad_norm") if clip > 0 else ("loss",)))
    print(f"{p:14s} dp 1/2/4/2x2: losses {ref[0]:.5f} -> {ref[-1]:.5f}" +
          (f", norms {ref_norms[0]:.4f} -> {ref_norms[-1]:.4f} (clipped at {clip:g})" if clip > 0 else "") +
          f", worst relative difference {worst:.1e}; "
          f"bytes per rank and link = the rank's schedule")
if bad:
    sys.exit("FAILED:\n  " + "\n  ".join(bad))
PY
