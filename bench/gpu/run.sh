#!/usr/bin/env bash
# bench/gpu/run.sh [REPORT]: everything memwall's GPU path must show, in one command on a machine
# with an NVIDIA GPU, from an unpacked bundle (bench/gpu/bundle.sh); about 8 minutes on one H100.
# Sections, each under its own time limit, each PASS, FAIL or TIMEOUT in the summary:
#   device      the GPU (nvidia-smi), where the CUDA libraries come from, the bundle's manifest
#   ops         every backend kernel on cuda against the cpu backend (test_backend_ops)
#   engine      every engine test that runs on cuda (test_engine, the tests named .../cuda)
#   placements  every placement trained 20 steps on cuda beside cpu: losses compared
#   torch       the GPT on cuda against PyTorch (torch_reference.py; skipped without torch)
#   sanitizer   compute-sanitizer memcheck over the cuda op tests and 3 training steps (skipped without it)
#   calibrate   memwall calibrate --backend cuda: a profile of this machine
#   validate    memwall validate on that profile for three placements: simulated against measured
#   mfu         model FLOPs utilisation of a model that fits (results/METRICS.md, "MFU")
#   breakdown   that model's step, operator by operator (one step run serially, from its trace)
#   offload     offloaded training's host<->device traffic against the copy bandwidth and the PCIe bound
# The whole run keeps within MEMWALL_GPU_BUDGET_S (default 570 s): a section that would start with
# less than 15 s left is NOT RUN and counts as failed.
# MEMWALL_REQUIRE_CUDA=1 is set: a test that would skip for want of a device fails instead, and a
# device error is reported as what it is (the CUDA error string), never as "no device".
# Everything goes to REPORT (default ./memwall-gpu-report.txt); the exit code is the number of
# failed sections (0: all passed). MEMWALL_GPU_SECTIONS="ops engine" runs only those.
set -uo pipefail
root=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
report=${1:-$PWD/memwall-gpu-report.txt}
case "$report" in /*) ;; *) report="$PWD/$report" ;; esac
launch="$root/bin/launch"
share="$root/share/memwall"
work=$(mktemp -d "${TMPDIR:-/tmp}/memwall-gpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
export MEMWALL_REQUIRE_CUDA=1
sections=${MEMWALL_GPU_SECTIONS:-device ops engine placements torch sanitizer calibrate validate mfu breakdown offload}
python=$(command -v python3 || true)
: > "$report"
summary=()
failed=0

say() { echo "$*" | tee -a "$report"; }
# section NAME LIMIT_S FUNCTION: runs FUNCTION with its output in the report, under a time limit
# (and within what is left of the whole run's budget)
budget=${MEMWALL_GPU_BUDGET_S:-570}
start=$(date +%s)
section() {
  local name=$1 limit=$2 fn=$3 t0 rc status left
  case " $sections " in *" $name "*) ;; *) return ;; esac
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 15 ]; then
    summary+=("$(printf '%-11s %-24s' "$name" "NOT RUN (budget spent)")")
    failed=$((failed + 1))
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  say ""
  say "=== $name ($(date -u +%H:%M:%S), limit ${limit} s)"
  t0=$(date +%s)
  export -f "$fn"
  timeout --kill-after=10 "$limit" bash -c "$fn" > >(tee -a "$report") 2>&1
  rc=$?
  sleep 0.2  # let tee finish
  case $rc in
    0) status=PASS ;;
    77) status="SKIP (see above)" ;;
    124 | 137) status="TIMEOUT after ${limit} s"; failed=$((failed + 1)) ;;
    *) status="FAIL (exit $rc)"; failed=$((failed + 1)) ;;
  esac
  summary+=("$(printf '%-11s %-24s %4d s' "$name" "$status" $(($(date +%s) - t0)))")
}
export root launch share work python report

# A run YAML: the short GPT of the tests on cuda, fp32 compute and fp32 states unless told otherwise.
config() {  # config FILE BACKEND COMPUTE PRECISION [extra lines...]
  local f=$1 backend=$2 compute=$3 precision=$4
  shift 4
  { printf 'layers: 2\nhidden: 64\nheads: 4\nseq: 32\nbsz: 4\nsteps: 20\nlr: 3e-3\nseed: 11\n'
    printf 'backend: %s\ncompute: %s\nprecision: %s\ncapacity: 256 MiB\n' "$backend" "$compute" "$precision"
    for l in "$@"; do echo "$l"; done; } > "$f"
}
export -f config

device() {
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max,clocks.max.sm \
      --format=csv
  else
    echo "nvidia-smi: not on PATH"
  fi
  echo "CUDA libraries:"
  "$launch" --where | sed 's/^/  /' || exit 1
  echo "host: $(uname -srm), $(nproc) cores, $(ldd --version 2>&1 | head -n 1)"
  sed 's/^/  /' "$root/MANIFEST" 2>/dev/null | head -n 3
  "$launch" memwall --version
}

ops() {
  "$launch" test_backend_ops --gtest_brief=1
}

engine() {
  "$launch" test_engine --gtest_brief=1 --gtest_filter='*/cuda*'
}

placements() {
  local fails=0 s
  for s in data_parallel zero2 zero_offload zero3 zero_inf_cpu zero_inf_nvme l2l; do
    for b in cpu cuda; do
      config "$work/$b.yaml" "$b" fp32 fp32
      mkdir -p "$work/swap-$b"
      "$launch" memwall run --config "$work/$b.yaml" --strategy "$s" --nvme-dir "$work/swap-$b" --json \
        > "$work/$s-$b.json" 2> "$work/$s-$b.err" || { echo "$s on $b failed:"; cat "$work/$s-$b.err"; fails=$((fails + 1)); }
    done
    "$python" - "$s" "$work/$s-cpu.json" "$work/$s-cuda.json" <<'EOF' || fails=$((fails + 1))
import json, sys
s, a, b = sys.argv[1], json.loads(open(sys.argv[2]).read().splitlines()[-1]), json.loads(open(sys.argv[3]).read().splitlines()[-1])
la, lb = [x["loss"] for x in a["steps"]], [x["loss"] for x in b["steps"]]
rel = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
# the cuda kernels sum in other orders and cuBLAS picks its own GEMM algorithms: close, not equal
ok = len(la) == len(lb) == 20 and rel <= 2e-3
print(f"{s:14s} loss cpu {la[0]:.5f} -> {la[-1]:.5f}  cuda {lb[0]:.5f} -> {lb[-1]:.5f}  max rel diff {rel:.2e}  "
      f"iteration cuda {b['iteration_s_median'] * 1e3:.2f} ms  {'ok' if ok else 'FAIL (> 2e-3)'}")
sys.exit(0 if ok else 1)
EOF
  done
  # mixed precision as memwall trains by default: bf16 states, bf16 tensor-core GEMMs; loss must fall
  config "$work/bf16.yaml" cuda bf16 bf16
  "$launch" memwall run --config "$work/bf16.yaml" --strategy zero_inf_cpu --steps 40 || fails=$((fails + 1))
  exit $fails
}

torch() {
  [ -n "$python" ] && "$python" -c 'import torch' 2> /dev/null || { echo "no python3 with torch: skipped"; exit 77; }
  printf '#!/bin/sh\nexec "%s" gpt_ref_tool "$@"\n' "$launch" > "$work/gpt_ref_tool"
  chmod +x "$work/gpt_ref_tool"
  "$python" "$share/torch_reference.py" "$work/gpt_ref_tool" cuda
}

sanitizer() {
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null || true)
  [ -n "$cs" ] || { echo "compute-sanitizer: not found: skipped"; exit 77; }
  "$cs" --tool memcheck --target-processes all --error-exitcode 9 --print-limit 20 \
    "$launch" test_backend_ops --gtest_brief=1 --gtest_filter='*/cuda*:-*TrainingSizes*' || exit 1
  # and the kernels as the engine calls them: 3 steps of training, parameters fetched from CPU memory
  config "$work/san.yaml" cuda fp32 bf16
  "$cs" --tool memcheck --target-processes all --error-exitcode 9 --print-limit 20 \
    "$launch" memwall run --config "$work/san.yaml" --strategy zero_inf_cpu --steps 3 > "$work/san.log" 2>&1
  local rc=$?
  grep -E "COMPUTE-SANITIZER|ERROR SUMMARY|^loss" "$work/san.log"
  exit $rc
}

# Calibrated at the shapes validate then runs (B 8, T 256, hidden 512): the kernels' rates depend on
# them (attention's batched GEMMs over 64 tokens are launch-bound, over 256 they are not).
calibrate() {
  mkdir -p "$work/cal"
  "$launch" memwall calibrate --backend cuda --nvme-dir "$work/cal" --name lent-gpu --hidden 256 512 1024 \
    --kernel-hidden 512 --bsz 8 --seq 256 -o "$work/gpu.yaml" && cat "$work/gpu.yaml"
}

validate() {
  [ -f "$work/gpu.yaml" ] || { echo "no profile (calibrate failed or did not run)"; exit 1; }
  local fails=0 s
  printf 'layers: 4\nhidden: 512\nheads: 8\nseq: 256\nbsz: 8\nsteps: 6\nlr: 1e-4\nseed: 1\n' > "$work/val.yaml"
  printf 'backend: cuda\ncompute: bf16\nprecision: bf16\ncapacity: 8 GiB\nci: 1\n' >> "$work/val.yaml"
  for s in data_parallel zero_inf_cpu zero_inf_nvme; do
    mkdir -p "$work/swap-val"
    "$launch" memwall validate --profile "$work/gpu.yaml" --config "$work/val.yaml" --strategy "$s" \
      --nvme-dir "$work/swap-val" || fails=$((fails + 1))
  done
  exit $fails
}

# MFU (results/METRICS.md, "Throughput and utilisation"): memwall run --json computes MFU and HFU
# (throughput.mfu, .hfu) against the datasheet peak of the GPU that ran it (throughput.mfu_peak
# names it: model/throughput.cpp's gpu_datasheet_peak, by CUDA's device name).
mfu() {
  local f="$work/mfu.yaml"
  printf 'layers: 12\nhidden: 1024\nheads: 16\nseq: 1024\nbsz: 8\nsteps: 8\nlr: 1e-4\nseed: 1\n' > "$f"
  printf 'backend: cuda\ncompute: bf16\nprecision: bf16\ncapacity: 60 GiB\nci: 1\n' >> "$f"
  "$launch" memwall run --config "$f" --strategy data_parallel --json > "$work/mfu.json" || exit 1
  "$python" - "$work/mfu.json" <<'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
tp = r["throughput"]
print(f"{r['params'] / 1e6:.1f} M parameters, {tp['tokens_per_step']:.0f} tokens per step, "
      f"step {r['iteration_s_median'] * 1e3:.1f} ms (median)")
print(f"{tp['model_tflops_per_gpu']:.1f} model TFLOPS, {tp['hardware_tflops_per_gpu']:.1f} hardware TFLOPS: "
      f"MFU {100 * tp['mfu']:.1f} %, HFU {100 * tp['hfu']:.1f} % of {tp['mfu_peak_flops_per_s'] / 1e12:.1f} TFLOPS "
      f"({tp['mfu_peak']})")
EOF
}

# Where the MFU model's step goes: one step run serially (--serial: each step of the schedule alone,
# so the trace's durations are the operators' own), compute time summed per operator over forward,
# recompute and backward.
breakdown() {
  "$launch" memwall run --config "$work/mfu.yaml" --strategy data_parallel --steps 2 --serial \
    --trace "$work/mfu-trace.json" > /dev/null || exit 1
  "$python" - "$work/mfu-trace.json" <<'EOF'
import json, re, sys, collections
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
per = collections.Counter()
for e in ev:
    if e.get("ph") == "X" and e["name"].startswith("compute "):
        per[re.sub(r"^compute (block\d+\.)?", "", e["name"]).split("[")[0]] += e["dur"] / 1e3
total = sum(per.values())
print(f"compute, one step run serially: {total:.1f} ms")
for op, ms in per.most_common():
    print(f"  {op:16s} {ms:8.2f} ms  {100 * ms / total:5.1f} %")
EOF
}

# Offloaded training: parameters fetched from and gradients sent to pinned host memory every step.
offload() {
  local f="$work/off.yaml"
  printf 'layers: 8\nhidden: 2048\nheads: 16\nseq: 512\nbsz: 4\nsteps: 6\nlr: 1e-4\nseed: 1\n' > "$f"
  printf 'backend: cuda\ncompute: bf16\nprecision: bf16\ncapacity: 16 GiB\nci: 1\n' >> "$f"
  "$launch" memwall run --config "$f" --strategy zero_inf_cpu --json > "$work/off.json" || exit 1
  "$python" - "$work/off.json" "$work/gpu.yaml" <<'EOF'
import json, sys, re, os
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
t = r["iteration_s_median"]
print(f"zero_inf_cpu, {r['params'] / 1e6:.0f} M parameters: step {t * 1e3:.1f} ms (median), compute {r['compute_s'] * 1e3:.1f} ms, "
      f"{100 * r['hidden_fraction']:.1f} % of transfer time hidden")
link = r["links"].get("cpu_gpu", {})
moved, busy = link.get("moved_bytes", 0), link.get("transfer_s", 0)
print(f"cpu_gpu: {moved / 1e9:.3f} GB per step (schedule {link.get('schedule_bytes', 0) / 1e9:.3f} GB), "
      f"transfers busy {busy * 1e3:.1f} ms, exposed {link.get('exposed_s', 0) * 1e3:.1f} ms")
if busy > 0:
    print(f"offload throughput while transferring: {moved / busy / 1e9:.1f} GB/s; over the whole step: {moved / t / 1e9:.1f} GB/s")
if os.path.exists(sys.argv[2]):
    for m in re.finditer(r"^\s*(pcie_\w+):\s*(\S+ \S+)", open(sys.argv[2]).read(), re.M):
        print(f"  calibrated {m.group(1)}: {m.group(2)} (page-locked copies, 1 MiB pieces)")
print("PCIe bound: gen5 x16 moves 63 GB/s per direction before protocol overhead (gen4 x16: 31.5)")
EOF
}

say "memwall GPU report: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), bundle $root"
section device 30 device
section ops 90 ops
section engine 200 engine
section placements 120 placements
section torch 90 torch
section calibrate 90 calibrate
section validate 90 validate
section mfu 60 mfu
section breakdown 60 breakdown
section offload 60 offload
section sanitizer 120 sanitizer
say ""
say "=== summary"
for l in "${summary[@]}"; do say "$l"; done
say "$failed section(s) failed; report: $report"
exit "$failed"
