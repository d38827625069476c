#!/usr/bin/env bash
# interleaved_ranks.sh MEMWALL: interleaved 1F1B (issue 28, item 3) under mpirun. Each stage holds v
# chunks of blocks (chunk k of stage s is virtual stage k pp + s), the last stage sends each chunk's
# output on to the first, and the passes run in Megatron-LM's interleaved order. An 8-block GPT
# (untied head, and its tied embedding: the copies on the first stage's first chunk and the last
# stage's last chunk), global batch 8 sequences (micro-batch 2), 10 steps, against the one-rank run:
# pp 2 x v 2, pp 2 x v 4 (one block per chunk), pp 4 x v 2, pp 2 x v 2 x dp 2 and mp 2 x pp 2 x v 2
# x dp 2 (8 ranks), with zero3 and zero_inf_nvme: the same losses within 1e-5 relative, and every
# rank's bytes per link class equal to its own stage's schedule (v times the stage messages).
set -euo pipefail
# memwall run starts itself again to set OMP_WAIT_POLICY=passive and glibc.malloc.hugetlb=1
# (cli/main.cpp, start_with_settings) when they are not set; set here, each of the many ranks below
# starts once (an 8-rank run: 0.81x the time).
export OMP_WAIT_POLICY=passive GLIBC_TUNABLES=glibc.malloc.hugetlb=1
mw=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
cat >"$dir/gpt.yaml" <<EOT
layers: 8
hidden: 64
heads: 4
seq: 16
bsz: 2
steps: 10
lr: 3e-3
precision: fp32
tied_embeddings: false
EOT
sed '/^tied_embeddings/d' "$dir/gpt.yaml" >"$dir/tied.yaml"
# layout: ranks pp mp grad-accum virtual-stages
layouts=("2 2 1 4 2" "2 2 1 4 4" "4 4 1 4 2" "4 2 1 2 2" "8 2 2 2 2")
for kind in gpt tied; do
  for p in zero3 zero_inf_nvme; do
    mkdir -p "$dir/swap.$kind.$p.ref"
    "$mw" run --config "$dir/$kind.yaml" --strategy "$p" --grad-accum 4 --nvme-dir "$dir/swap.$kind.$p.ref" \
      --json >"$dir/$kind.$p.ref.json"
    for l in "${layouts[@]}"; do
      read -r np pp mp ga v <<<"$l"
      tag="$kind.$p.$np.$pp.$mp.$v"
      mkdir -p "$dir/swap.$tag"
      timeout 300 "${mpi[@]}" -np "$np" "$mw" run --config "$dir/$kind.yaml" --strategy "$p" --pp "$pp" --mp "$mp" \
        --virtual-stages "$v" --grad-accum "$ga" --nvme-dir "$dir/swap.$tag" --json >"$dir/$tag.json"
    done
  done
done
HERE=$(cd "$(dirname "$0")" && pwd) python3 - "$dir" "${layouts[@]}" <<'PY'
import os, sys
sys.path.insert(0, os.environ["HERE"])
from layout_check import compare, summary
d, layouts = sys.argv[1], sys.argv[2:]
bad = []
for kind in ("gpt", "tied"):
    for p in ("zero3", "zero_inf_nvme"):
        ref = summary(f"{d}/{kind}.{p}.ref.json")
        worst = 0.0
        for l in layouts:
            np_, pp, mp, ga, v = map(int, l.split())
            j = summary(f"{d}/{kind}.{p}.{np_}.{pp}.{mp}.{v}.json")
            got = (j["pp"], j.get("virtual_stages", 1), j["mp"], j["dp"], j["global_batch"], len(j["ranks"]))
            if got != (pp, v, mp, np_ // (pp * mp), 8, np_):
                bad.append(f"{kind} {p} {l}: pp, virtual stages, mp, dp, global batch, ranks = {got}")
            worst = max(worst, compare(ref, j, f"{kind} {p} {l}", bad))
        steps = ref["steps"]
        print(f"{kind:4s} {p:13s} losses {steps[0]['loss']:.5f} -> {steps[-1]['loss']:.5f} against pp 2 x v 2, "
              f"pp 2 x v 4, pp 4 x v 2, pp 2 x v 2 x dp 2, mp 2 x pp 2 x v 2 x dp 2: worst relative difference "
              f"{worst:.1e}; bytes per rank and link = the rank's schedule")
if bad:
    print("FAIL:\n  " + "\n  ".join(bad[:20]))
    sys.exit(1)
PY
