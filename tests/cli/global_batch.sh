#!/usr/bin/env bash
# global_batch.sh MEMWALL: `memwall plan --global-batch N` end to end (issue 17). Every plan trains N
# samples per optimizer step (bsz x grad-accum x dp, dp free to be fewer than all GPUs); the text,
# the JSON, the plan file and the DeepSpeed export say so; `simulate --plan` runs the accumulation
# steps before the optimizer; `run --plan` of a plan for this machine runs its micro-steps. Without
# the flag the output says the global batch is free.
set -euo pipefail
mw=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
model=(--layers 4 --hidden 2K --heads 16)

# 8 samples on dgx2's 16 GPUs: at most 8 data-parallel ranks
"$mw" plan "${model[@]}" --global-batch 8 --json >"$dir/few.json"
# 1024 samples: the micro-batch stops at 32, so 16 ranks accumulate
"$mw" plan "${model[@]}" --global-batch 1024 -o "$dir/p.yaml" --deepspeed "$dir/ds.json" >"$dir/p.txt"
"$mw" plan "${model[@]}" --global-batch 1024 --json >"$dir/p.json"
"$mw" plan "${model[@]}" >"$dir/free.txt"
python3 - "$dir" <<'PY'
import json, re, sys
d = sys.argv[1]
few = json.load(open(d + "/few.json"))
assert few["global_batch_fixed"] is True, few
assert few["global_batch"] == 8 and few["bsz"] * few["grad_accum"] * few["dp"] == 8, few
assert few["dp"] <= 8, few
for r in few["runners_up"]:
    assert r["bsz"] * r["grad_accum"] * r["dp"] == 8, r
j = json.load(open(d + "/p.json"))
assert j["global_batch"] == 1024 and j["grad_accum"] > 1, j
text = open(d + "/p.txt").read()
m = re.search(r"global batch 1024 = bsz (\d+) x grad-accum (\d+) x dp (\d+) \(--global-batch\); (\d+) of 16 GPUs", text)
assert m, text
bsz, acc, dp, used = map(int, m.groups())
assert bsz * acc * dp == 1024 and used == dp * j["mp"], m.groups()
plan = open(d + "/p.yaml").read()
assert re.search(r"^  grad_accum: %d\b" % acc, plan, re.M), plan
assert re.search(r"^  global_batch: 1024\b", plan, re.M), plan
ds = json.load(open(d + "/ds.json"))
assert ds["gradient_accumulation_steps"] == acc and ds["train_batch_size"] == 1024, ds
assert ds["train_micro_batch_size_per_gpu"] == bsz, ds
free = open(d + "/free.txt").read()
assert "global batch unconstrained: bsz" in free and "--global-batch N" in free, free
PY
# the simulator replays every micro-step: the plan's iteration takes longer than one micro-step's
"$mw" simulate --plan "$dir/p.yaml" --json >"$dir/sim.json"
sed -E 's/^  grad_accum: [0-9]+.*/  grad_accum: 1/; /^  global_batch:/d' "$dir/p.yaml" >"$dir/one.yaml"
"$mw" simulate --plan "$dir/one.yaml" --json >"$dir/sim1.json"
python3 - "$dir/sim.json" "$dir/sim1.json" "$dir/p.yaml" <<'PY'
import json, re, sys
# the plan simulated: the one written beside the DeepSpeed export, which may differ from --json's
# (DeepSpeed runs no optimizer overlap, so its plan may pick another placement and micro-batch)
acc = int(re.search(r"^  grad_accum: (\d+)", open(sys.argv[3]).read(), re.M).group(1))
t, t1 = json.load(open(sys.argv[1]))["iteration_s"], json.load(open(sys.argv[2]))["iteration_s"]
# acc micro-steps and one optimizer step: more than (acc - 1) micro-steps' worth, at most acc times one
assert t1 * (acc - 1) * 0.5 < t <= t1 * acc * 1.001, (t, t1, acc)
PY
# a plan for this machine with accumulation runs as planned: its header names the micro-steps and
# the global batch, and the losses are finite
"$mw" plan --profile local-cpu --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 256 --global-batch 16 \
  --fix strategy=zero_offload --fix bsz=4 -o "$dir/local.yaml" >/dev/null
grep -q "^  grad_accum: 4\b" "$dir/local.yaml" || { cat "$dir/local.yaml"; exit 1; }
"$mw" run --plan "$dir/local.yaml" --steps 2 >"$dir/run.out"
grep -q "dp 1, grad-accum 4 (global batch 16)" "$dir/run.out" || { cat "$dir/run.out"; exit 1; }
grep -Eq "^loss [0-9.]+ -> [0-9.]+ over 2 steps" "$dir/run.out" || { cat "$dir/run.out"; exit 1; }
echo "global_batch.sh: ok"
