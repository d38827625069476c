#!/usr/bin/env bash
# memwall calibrate writes a profile of this machine that every command loads; memwall validate
# executes and simulates the same schedule (it refuses to compare different ones) and reports both.
# Usage: calibrate_validate.sh MEMWALL RUN_YAML
set -euo pipefail
mw=$1 cfg=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --allow-busy: ctest runs other tests beside this one (calibrate_busy.sh tests the refusal)
"$mw" calibrate --quick --allow-busy --nvme-dir "$tmp" --device-memory 256MiB -o "$tmp/p.yaml" > "$tmp/cal.txt" 2> "$tmp/cal.err"
cat "$tmp/cal.txt"
# every measured field says how; what one process cannot measure is left out, and says so
grep -Eq '^  peak: [0-9.]+ [GT]FLOPS +# measured' "$tmp/p.yaml" || fail "no measured gpu.peak"
grep -Eq '^    gelu: [0-9.]+ [kMG]B/s +# ' "$tmp/p.yaml" || fail "no measured gelu rate"
grep -Eq '^    attention_scores: [0-9.]+ [GTM]FLOPS' "$tmp/p.yaml" || fail "no measured attention rate"
grep -Eq '^  read: [0-9.]+ [kMG]B/s +# measured: io_uring' "$tmp/p.yaml" || fail "no measured nvme.read"
grep -q '^  # gpu_gpu: not measured: one process' "$tmp/p.yaml" || fail "gpu_gpu should be left out, with the reason"
grep -q 'shared_peak' "$tmp/p.yaml" && fail "one process cannot measure gpu.shared_peak"
# gpu.gemm: every linear layer's GEMM at each hidden size, whole and as tiles (--quick: 128 and 256;
# fc1 at hidden 256 is (512 x 256) x (256 x 1024), its tiles at tiling 4 256 columns wide)
grep -Eq '^    - \{m: 512, n: 1024, k: 256, rate: [0-9.]+ [GTM]FLOPS\}' "$tmp/p.yaml" || fail "no measured fc1 GEMM at hidden 256"
grep -Eq '^    - \{m: 512, n: 64, k: 1024, rate: [0-9.]+ [GTM]FLOPS\}' "$tmp/p.yaml" || fail "no measured fc2 tile at tiling 4"
grep -q 'calibrate: NVMe' "$tmp/cal.err" || fail "no progress on stderr"
grep -Eq "^# The same block's iterations ran up to [0-9.]+ % apart" "$tmp/p.yaml" || fail "the profile does not say how steady the machine was"
ls "$tmp" | grep -qv -e '^p.yaml$' -e '^cal' && fail "calibrate left files behind: $(ls "$tmp")"

# the profile is a profile: simulate and plan read it
"$mw" simulate --profile "$tmp/p.yaml" --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 256 --bsz 8 \
  --strategy zero_inf_cpu > /dev/null || fail "simulate does not take the calibrated profile"

# validate: the same schedule executed and simulated, for offload to CPU, and to NVMe with tiling
for args in "--strategy zero_inf_cpu" "--strategy zero_inf_nvme --tiling 2 --nvme-dir $tmp"; do
  # shellcheck disable=SC2086
  "$mw" validate --profile "$tmp/p.yaml" --config "$cfg" $args --steps 3 --json --trace-dir "$tmp" > "$tmp/v.json" \
    || fail "validate $args"
  /usr/bin/python3 - "$tmp/v.json" <<'PY' || fail "validate $args: report"
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
it = j["iteration_s"]
assert it["measured"] > 0 and it["simulated"] > 0, it
assert abs(it["error_pct"] - 100 * (it["simulated"] - it["measured"]) / it["measured"]) < 1e-6, it
# the steady steps' range: the step lines after the first (warm-up)
lines = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()[:-1]]
steady = [l["iteration_s"] for l in lines if l["type"] == "step"][1:]
assert len(steady) == 2 and it["measured_min"] == min(steady) and it["measured_max"] == max(steady), (it, steady)
assert abs(it["measured_spread_pct"] - 100 * (max(steady) - min(steady)) / it["measured"]) < 1e-6, it
assert set(j["phase_s"]) >= {"forward", "backward", "optimizer"}, j["phase_s"].keys()
assert "compute" in j["busy_s"] and "cpu_gpu" in j["busy_s"], j["busy_s"].keys()
steps = j["most_different_steps"]
assert len(steps) == 10 and all(0 <= s["step"] < j["schedule_steps"] for s in steps), steps
d = [abs(s["simulated_start_s"] - s["measured_start_s"]) for s in steps]
assert d == sorted(d, reverse=True), d
for t in j["traces"]:
    ev = json.load(open(t))["traceEvents"]
    assert sum(e.get("ph") == "X" for e in ev) > 50, t
PY
done
if [ -n "$(ls "$tmp" | grep memwall-)" ]; then fail "swap or temporary files left: $(ls "$tmp")"; fi

# two ranks of the cpu backend share this machine's cores (issue 28 item 8): gpu.peak is one rank's
# rate alone, gpu.shared_peak all ranks' at once; validate of dp 2 replays both ranks on the shared
# cores (sim/replay.cpp) and runs
mpi=(timeout 300 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2)
"${mpi[@]}" "$mw" calibrate --quick --allow-busy --nvme-dir "$tmp" --device-memory 256MiB -o "$tmp/p2.yaml" \
  > "$tmp/cal2.txt" 2>&1 || { cat "$tmp/cal2.txt"; fail "mpirun -np 2 calibrate"; }
grep -Eq '^  shared_peak: [0-9.]+ [GT]FLOPS +# measured: the linear layers of a block at hidden [0-9]+ on all 2 ranks at once' \
  "$tmp/p2.yaml" || { cat "$tmp/p2.yaml"; fail "no measured gpu.shared_peak under mpirun -np 2"; }
grep -Eq '^  peak: [0-9.]+ [GT]FLOPS +# measured' "$tmp/p2.yaml" || fail "no measured gpu.peak under mpirun -np 2"
"${mpi[@]}" "$mw" validate --profile "$tmp/p2.yaml" --config "$cfg" --strategy zero3 --steps 3 --json > "$tmp/v2.json" \
  2> "$tmp/v2.err" || { cat "$tmp/v2.err"; fail "validate under mpirun -np 2 with gpu.shared_peak"; }
/usr/bin/python3 - "$tmp/v2.json" <<'PY' || fail "validate dp 2: report"
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert j["iteration_s"]["measured"] > 0 and j["iteration_s"]["simulated"] > 0, j["iteration_s"]
PY
# two pipeline stages: rank 0 validates the first, whose steps are numbered from 0 as the second
# stage's are; its simulated side is its own GPU's steps in the trace (the other stage's steps of the
# same ids once stretched its busy time over the bubble: 0.606 s of compute for 0.477)
"${mpi[@]}" "$mw" validate --profile "$tmp/p2.yaml" --config "$cfg" --strategy zero3 --pp 2 --grad-accum 4 --steps 3 \
  --json --trace-dir "$tmp" > "$tmp/v3.json" 2> "$tmp/v3.err" || { cat "$tmp/v3.err"; fail "validate --pp 2"; }
/usr/bin/python3 - "$tmp/v3.json" "$tmp/simulated.json" <<'PY' || fail "validate pp 2: the first stage's own steps"
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
ev = [e for e in json.load(open(sys.argv[2]))["traceEvents"] if e.get("ph") == "X"]
assert {e["pid"] for e in ev} == {0, 1}, "both stages replayed"
mine = [e for e in ev if e["pid"] == 0]
start = {}
for e in mine:
    start[e["args"]["step"]] = min(start.get(e["args"]["step"], 1e30), e["ts"] / 1e6)
for s in j["most_different_steps"]:
    assert abs(s["simulated_start_s"] - start[s["step"]]) < 1e-6, (s, start.get(s["step"]))
iv = sorted((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in mine if e["cat"].endswith("gpu_compute"))
busy, end = 0.0, -1.0
for a, b in iv:
    busy += max(0.0, b - max(a, end))
    end = max(end, b)
got = j["busy_s"]["compute"]["simulated"]
assert abs(got - busy) <= 1e-3 * busy, f"busy compute {got} s, stage 0's own {busy} s"
PY
rm -f "$tmp/p2.yaml" "$tmp"/cal2.txt "$tmp"/v2.* "$tmp"/v3.* "$tmp"/measured.json "$tmp"/simulated.json

# bad input: one line, exit 2
out=$("$mw" validate --profile "$tmp/p.yaml" --config "$cfg" --steps 1 2>&1 >/dev/null) && fail "--steps 1 accepted"
[ "$out" = "memwall validate: --steps: expected at least 2 (one warm-up, one measured), got 1" ] || fail "got: $out"
out=$("$mw" calibrate --nvme-dir /nonexistent 2>&1 >/dev/null) && fail "a missing --nvme-dir accepted"
[ "$out" = "memwall calibrate: --nvme-dir: /nonexistent: not a folder" ] || fail "got: $out"
echo "ok"
