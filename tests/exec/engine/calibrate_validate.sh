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
grep -q 'calibrate: NVMe' "$tmp/cal.err" || fail "no progress on stderr"
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

# bad input: one line, exit 2
out=$("$mw" validate --profile "$tmp/p.yaml" --config "$cfg" --steps 1 2>&1 >/dev/null) && fail "--steps 1 accepted"
[ "$out" = "memwall validate: --steps: expected at least 2 (one warm-up, one measured), got 1" ] || fail "got: $out"
out=$("$mw" calibrate --nvme-dir /nonexistent 2>&1 >/dev/null) && fail "a missing --nvme-dir accepted"
[ "$out" = "memwall calibrate: --nvme-dir: /nonexistent: not a folder" ] || fail "got: $out"
echo "ok"
