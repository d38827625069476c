#!/usr/bin/env bash
# pp_ranks.sh MEMWALL [PLACEMENTS...]: pipeline stages (issue 26) under mpirun. With the global batch
# fixed at 8 sequences (micro-batch 2), the one-rank run with 4 accumulated micro-steps against pp 2,
# pp 3 and pp 4 (1F1B over the same 4 micro-steps: up to 4 in flight on the first stage, middle
# stages that receive and send both ways) and pp 2 x dp 2 (2 micro-steps each), 8 steps: the same
# losses within 1e-5 relative (fp32; every stage computes what the one rank computes, in the same
# order, so they agree bit for bit in practice), for a GPT with an untied head and a Llama-kind
# block, every placement given (default zero3, zero_inf_cpu, zero_inf_nvme, data_parallel,
# zero_offload). Every rank's bytes per link class equal its own stage's schedule (the sends and
# receives included), and the job has dp x pp ranks. A tied embedding is refused with the reason.
set -euo pipefail
mw=$1
shift
placements=("$@")
[ ${#placements[@]} -gt 0 ] || placements=(zero3 zero_inf_cpu zero_inf_nvme data_parallel zero_offload)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
cat >"$dir/gpt.yaml" <<EOT
layers: 4
hidden: 64
heads: 4
seq: 16
bsz: 2
steps: 8
lr: 3e-3
precision: fp32
tied_embeddings: false
EOT
sed 's/^tied_embeddings: false/tied_embeddings: false\nkv_heads: 2\nffn: swiglu\nintermediate: 96\nnorm: rmsnorm\npositions: rotary\nbias: none/' \
  "$dir/gpt.yaml" >"$dir/llama.yaml"
# layout: ranks pp grad-accum
layouts=("1 1 4" "2 2 4" "3 3 4" "4 4 4" "4 2 2")
for kind in gpt llama; do
  for p in "${placements[@]}"; do
    [ $kind = llama ] && [ "$p" != zero3 ] && [ "$p" != zero_inf_nvme ] && continue
    for l in "${layouts[@]}"; do
      read -r np pp ga <<<"$l"
      tag="$kind.$p.$np.$pp"
      mkdir -p "$dir/swap.$tag"
      if [ "$np" = 1 ]; then
        "$mw" run --config "$dir/$kind.yaml" --strategy "$p" --grad-accum "$ga" --nvme-dir "$dir/swap.$tag" --json >"$dir/$tag.json"
      else
        timeout 300 "${mpi[@]}" -np "$np" "$mw" run --config "$dir/$kind.yaml" --strategy "$p" --pp "$pp" \
          --grad-accum "$ga" --nvme-dir "$dir/swap.$tag" --json >"$dir/$tag.json"
      fi
    done
  done
done
# refused with the reason: a tied embedding, and a job whose ranks the stages do not divide
sed '/^tied_embeddings/d' "$dir/gpt.yaml" >"$dir/tied.yaml"
out=$("$mw" run --config "$dir/tied.yaml" --pp 2 2>&1) && exit 1
echo "$out" | grep -q "a tied embedding has copies on the first and last stage" || { echo "FAIL: $out"; exit 1; }
out=$("$mw" run --config "$dir/gpt.yaml" --pp 2 2>&1) && exit 1
echo "$out" | grep -q "ranks per data-parallel rank do not divide this job's 1 ranks" || { echo "FAIL: $out"; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd) python3 - "$dir" "${placements[@]}" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["HERE"])
from layout_check import compare
d, placements = sys.argv[1], sys.argv[2:]
bad = []
for kind in ("gpt", "llama"):
    for p in placements:
        if not os.path.exists(f"{d}/{kind}.{p}.1.1.json"):
            continue
        load = lambda tag: json.loads(open(f"{d}/{kind}.{p}.{tag}.json").read().splitlines()[-1])
        ref = [s["loss"] for s in load("1.1")["steps"]]
        worst = 0.0
        for tag in ("2.2", "3.3", "4.4", "4.2"):
            np_, pp = map(int, tag.split("."))
            j = load(tag)
            if (j["pp"], j["dp"], j["global_batch"], len(j["ranks"])) != (pp, np_ // pp, 8, np_):
                bad.append(f"{kind} {p} {tag}: pp {j['pp']} dp {j['dp']} global batch {j['global_batch']} "
                           f"ranks {len(j['ranks'])}")
            worst = max(worst, compare(load("1.1"), j, f"{kind} {p} {tag}", bad))
        print(f"{kind:5s} {p:14s} losses {ref[0]:.5f} -> {ref[-1]:.5f} against pp 2, 3, 4 and pp 2 x dp 2: "
              f"worst relative difference {worst:.1e}; bytes per rank and link = the rank's schedule")
if bad:
    sys.exit("FAILED:\n  " + "\n  ".join(bad))
PY
