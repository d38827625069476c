#!/usr/bin/env bash
# tp_ranks.sh MEMWALL [PLACEMENTS...]: tensor slicing (Megatron-LM's, issue 26) under mpirun. With the
# global batch fixed at 4 sequences, the one-rank run against mp 2, mp 4, mp 2 x dp 2 and mp 2 x dp 2
# accumulating 2 micro-steps of 1 sequence, for 10 steps: the same losses within 1e-5 relative (fp32:
# each slice sums its part of qkv's and fc1's input gradients and of proj's and fc2's outputs, then the
# all-reduce adds the parts, so the sums differ from one rank's only in order), for the paper's GPT
# and a Llama-kind block (grouped key/value heads, SwiGLU, RMSNorm, rotary positions, no biases,
# untied head), every placement given (default zero3, zero_inf_cpu, zero_inf_nvme, data_parallel,
# zero_offload; CTest runs one placement a test), with checkpoints partitioned across the slices (on
# the device and in CPU memory; when zero_inf_cpu is given), and with gradient clipping (the norm
# over slices and dp ranks; zero3, zero_inf_cpu and zero_inf_nvme, when given). Every rank's bytes
# per link class equal its own schedule's (the mp all-reduces and checkpoint all-gathers included),
# and the job has dp x mp ranks.
set -euo pipefail
# memwall run starts itself again to set OMP_WAIT_POLICY=passive and glibc.malloc.hugetlb=1
# (cli/main.cpp, start_with_settings) when they are not set; set here, each of the many ranks below
# starts once (an 8-rank run: 0.81x the time).
export OMP_WAIT_POLICY=passive GLIBC_TUNABLES=glibc.malloc.hugetlb=1
mw=$1
shift
placements=("$@")
[ ${#placements[@]} -gt 0 ] || placements=(zero3 zero_inf_cpu zero_inf_nvme data_parallel zero_offload)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
for kind in gpt llama; do
  for b in 4 2 1; do
    cat >"$dir/$kind$b.yaml" <<EOT
layers: 2
hidden: 64
heads: 4
seq: 16
bsz: $b
steps: 10
lr: 3e-3
precision: fp32
EOT
    [ $kind = llama ] && cat >>"$dir/$kind$b.yaml" <<EOT
kv_heads: 2
ffn: swiglu
intermediate: 96
norm: rmsnorm
positions: rotary
bias: none
tied_embeddings: false
EOT
  done
done
# layout: ranks mp bsz grad-accum
layouts=("1 1 4 1" "2 2 4 1" "4 4 4 1" "4 2 2 1" "4 2 1 2")
for kind in gpt llama; do
  for p in "${placements[@]}"; do
    for l in "${layouts[@]}"; do
      read -r np mp b ga <<<"$l"
      [ $kind = llama ] && [ "$mp" = 4 ] && continue  # 2 key/value heads split over 2 ranks at most
      tag="$kind.$p.$np.$mp.$ga"
      mkdir -p "$dir/swap.$tag"
      if [ "$np" = 1 ]; then
        "$mw" run --config "$dir/$kind$b.yaml" --strategy "$p" --nvme-dir "$dir/swap.$tag" --json >"$dir/$tag.json"
      else
        timeout 300 "${mpi[@]}" -np "$np" "$mw" run --config "$dir/$kind$b.yaml" --strategy "$p" --mp "$mp" \
          --grad-accum "$ga" --nvme-dir "$dir/swap.$tag" --json >"$dir/$tag.json"
      fi
    done
  done
done
given() { [[ " ${placements[*]} " == *" $1 "* ]]; }  # is placement $1 among those given
# checkpoints partitioned across the slices (1/mp each, all-gathered before the recompute), on the
# device and in CPU memory: the same losses as zero_inf_cpu's one rank
for place in act_ckpt=gpu/p act_ckpt=cpu/p; do
  given zero_inf_cpu || continue
  for l in "2 2 4 1" "4 2 2 1"; do
    read -r np mp b ga <<<"$l"
    tag="gpt.zero_inf_cpu.$np.$mp.$ga.${place//[=\/]/_}"
    timeout 300 "${mpi[@]}" -np "$np" "$mw" run --config "$dir/gpt$b.yaml" --strategy zero_inf_cpu --place "$place" \
      --mp "$mp" --json >"$dir/$tag.json"
  done
done
# gradient clipping at norm 2: each slice counts a parameter whole on every slice once (on the first
# slice); the sums are exchanged over dp, then over mp: the one-rank run's norms and losses
for b in 4 2; do sed 's/^steps: 10/steps: 10\ngrad_clip: 2/' "$dir/gpt$b.yaml" >"$dir/clip$b.yaml"; done
for p in zero3 zero_inf_cpu zero_inf_nvme; do
  given "$p" || continue
  mkdir -p "$dir/swap.clip.$p"
  "$mw" run --config "$dir/clip4.yaml" --strategy "$p" --nvme-dir "$dir/swap.clip.$p" --json >"$dir/clip.$p.1.1.json"
  for l in "2 2 4" "4 2 2"; do
    read -r np mp b <<<"$l"
    timeout 300 "${mpi[@]}" -np "$np" "$mw" run --config "$dir/clip$b.yaml" --strategy "$p" --mp "$mp" \
      --nvme-dir "$dir/swap.clip.$p" --json >"$dir/clip.$p.$np.$mp.json"
  done
done
HERE=$(cd "$(dirname "$0")" && pwd) python3 - "$dir" "${placements[@]}" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["HERE"])
from layout_check import compare, summary
d, placements = sys.argv[1], sys.argv[2:]
bad = []
for kind in ("gpt", "llama"):
    for p in placements:
        load = lambda tag: json.loads(open(f"{d}/{kind}.{p}.{tag}.json").read().splitlines()[-1])
        ref = [s["loss"] for s in load("1.1.1")["steps"]]
        worst, shown = 0.0, []
        for tag in ("2.2.1", "4.4.1", "4.2.1", "4.2.2"):
            if not os.path.exists(f"{d}/{kind}.{p}.{tag}.json"):
                continue
            np_, mp, ga = map(int, tag.split("."))
            j = load(tag)
            if (j["mp"], j["dp"], j["grad_accum"], j["global_batch"]) != (mp, np_ // mp, ga, 4):
                bad.append(f"{kind} {p} {tag}: mp {j['mp']} dp {j['dp']} grad_accum {j['grad_accum']} "
                           f"global batch {j['global_batch']}")
            if len(j["ranks"]) != np_:
                bad.append(f"{kind} {p} {tag}: {len(j['ranks'])} ranks reported, the job has {np_}")
            worst = max(worst, compare(load("1.1.1"), j, f"{kind} {p} {tag}", bad))
            shown.append(f"mp {mp} x dp {np_ // mp}" + (f" x accum {ga}" if ga > 1 else ""))
            for rank, links in enumerate(j["ranks"]):
                if mp > 1 and links.get("gpu_gpu", {}).get("schedule_bytes", 0) <= 0:
                    bad.append(f"{kind} {p} {tag} rank {rank}: no gpu_gpu bytes: the mp all-reduces are missing")
        print(f"{kind:5s} {p:14s} losses {ref[0]:.5f} -> {ref[-1]:.5f} against {', '.join(shown)}: "
              f"worst relative difference {worst:.1e}; bytes per rank and link = the rank's schedule")
if "zero_inf_cpu" in placements:
    ref = summary(f"{d}/gpt.zero_inf_cpu.1.1.1.json")
    for place in ("act_ckpt_gpu_p", "act_ckpt_cpu_p"):
        for tag in ("2.2.1", "4.2.1"):
            compare(ref, summary(f"{d}/gpt.zero_inf_cpu.{tag}.{place}.json"), f"zero_inf_cpu {place} {tag}", bad)
        print(f"gpt   zero_inf_cpu, {place.replace('_', ' ')}: mp 2 and mp 2 x dp 2 give one rank's losses")
for p in ("zero3", "zero_inf_cpu", "zero_inf_nvme"):
    if p not in placements:
        continue
    ref_run = summary(f"{d}/clip.{p}.1.1.json")
    ref = ref_run["steps"]
    if not any(s["grad_norm"] > 2 for s in ref):
        bad.append(f"clip {p}: no step's norm is above 2: nothing clipped")
    worst = 0.0
    for tag in ("2.2", "4.2"):
        worst = max(worst, compare(ref_run, summary(f"{d}/clip.{p}.{tag}.json"), f"clip {p} {tag}", bad,
                                   ("loss", "grad_norm")))
    print(f"gpt   {p:14s} clipped at 2: norms {ref[0]['grad_norm']:.4f} -> {ref[-1]['grad_norm']:.4f}; mp 2 and "
          f"mp 2 x dp 2 give one rank's norms and losses (worst {worst:.1e})")
if bad:
    sys.exit("FAILED:\n  " + "\n  ".join(bad))
PY
