#!/usr/bin/python3
"""tests/exec/engine/stress.py MEMWALL CONDITION:RUNS ...: issue 25's two configurations that failed
by timing, RUNS times each in each condition:

  A  8 layers, hidden 512, heads 8, seq 64, bsz 1, ci 1, capacity 1 GiB, zero_inf_nvme,
     --optimizer-overlap backward (failed 1 run in 3 at step 2: "cannot get its buffers")
  B  4 layers, hidden 256, heads 4, seq 64, bsz 4, ci 1, capacity 24 MiB, zero_inf_nvme
     (failed under load with the same message)

Conditions: `quiet` (the machine as the test finds it: alone, in a RUN_SERIAL test), `stress`
(beside `stress-ng --cpu 4`) and `beside` (the suite's other tests on the other slot, whatever
they run). Every run must finish (no "cannot get its buffers", no "stuck") and give the losses of
the reference: the same configuration run first with --strategy data_parallel (no NVMe, no
overlap, every state in device memory: its capacity 4 GiB), which the placements match bit for
bit. So the memory plan and the dependencies make the result independent of timing, and two
invocations check the same thing. A runs 1 step and B 2 (each step the whole schedule, the
overlapped optimizer included): A's one loss is the forward's, before any update, so its runs
check that the step finishes; B's second loss checks the update.
run.stress (RUN_SERIAL: quiet:4 stress:12) and run.stress.beside_suite (beside:8) together run
A 24 times: they miss a defect that fails 1 run in 3, as A's did, with a chance of (2/3)^24, 6e-5.
12 quiet and 12 loaded runs in one serial test took 157 s of a fresh clone's 975 s suite; 4 and
12, with each parameter initialised once rather than for the master and again for the 16-bit copy,
112 s (and 8 beside the suite about 30 s of the other slot's time).
With 2 and 3 steps and 20 runs it took 9.7 minutes, 80 of 80 runs passing (the note of issue 25
has the full runs). Prints what it found: per configuration and condition, runs passed, iteration
times, losses.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

memwall = sys.argv[1]
conditions = []
for arg in sys.argv[2:]:
    cond, _, n = arg.partition(":")
    if cond not in ("quiet", "stress", "beside") or not n.isdigit():
        sys.exit(f"stress.py: condition {arg!r}: expected quiet:N, stress:N or beside:N")
    conditions.append((cond, int(n)))
if not conditions:
    sys.exit("usage: stress.py MEMWALL CONDITION:RUNS ... (quiet, stress, beside)")
CONFIGS = {
    "A": ({"layers": 8, "hidden": 512, "heads": 8, "seq": 64, "bsz": 1, "ci": 1, "capacity": "1 GiB"},
          ["--strategy", "zero_inf_nvme", "--optimizer-overlap", "backward", "--steps", "1"]),
    "B": ({"layers": 4, "hidden": 256, "heads": 4, "seq": 64, "bsz": 4, "ci": 1, "capacity": "24 MiB"},
          ["--strategy", "zero_inf_nvme", "--steps", "2"]),
}
if shutil.which("stress-ng") is None:
    sys.exit("stress.py: stress-ng is not installed (setup.sh installs it)")
work = tempfile.mkdtemp(prefix="memwall-stress-", dir="/var/tmp")
failures = []


def run(name, cfg, flags):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        for k, v in cfg.items():
            f.write(f"{k}: {v}\n")
    swap = os.path.join(work, "swap-" + name)
    os.makedirs(swap, exist_ok=True)
    p = subprocess.run([memwall, "run", "--config", path, "--nvme-dir", swap, "--json", *flags],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    j = json.loads(p.stdout.splitlines()[-1])
    return j, None


def flags_of(flags, strategy):
    out = list(flags)
    out[out.index("--strategy") + 1] = strategy
    if "--optimizer-overlap" in out:
        del out[out.index("--optimizer-overlap"):out.index("--optimizer-overlap") + 2]
    return out


reference = {}
for name, (cfg, flags) in CONFIGS.items():
    j, err = run(name + "-reference", dict(cfg, capacity="4 GiB"), flags_of(flags, "data_parallel"))
    if err:
        sys.exit(f"stress.py: {name}'s reference run (data_parallel) failed: {err}")
    reference[name] = tuple(s["loss"] for s in j["steps"])
    print(f"{name} reference (data_parallel): losses {reference[name]}", flush=True)

stress = None
try:
    for condition, runs in conditions:
        label = {"quiet": "quiet", "stress": "under stress-ng --cpu 4", "beside": "beside the suite"}[condition]
        if condition == "stress":
            stress = subprocess.Popen(["stress-ng", "--cpu", "4", "--timeout", "3600"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, (cfg, flags) in CONFIGS.items():
            losses, times, errors = [], [], []
            for i in range(runs):
                j, err = run(name, cfg, flags)
                if err:
                    errors.append(err)
                    continue
                losses.append(tuple(s["loss"] for s in j["steps"]))
                times.append(j["iteration_s_median"])
            passed = runs - len(errors)
            print(f"{name} {label}: {passed} of {runs} runs passed; iteration {min(times, default=0)*1e3:.0f}-"
                  f"{max(times, default=0)*1e3:.0f} ms (median {statistics.median(times) if times else 0:.3f} s); "
                  f"losses {sorted(set(losses))[0] if losses else '-'}", flush=True)
            for e in sorted(set(errors)):
                print(f"  failed: {e}")
                failures.append(f"{name} {label}: {e}")
            wrong = sorted(set(l for l in losses if l != reference[name]))
            if wrong:
                print(f"  losses other than the reference's: {wrong}")
                failures.append(f"{name} {label}: {len(wrong)} other loss sequence(s) than the reference's")
        if stress:
            stress.terminate()
            stress.wait()
            stress = None
finally:
    if stress:
        stress.terminate()
    shutil.rmtree(work, ignore_errors=True)

if failures:
    sys.exit(f"stress.py: {len(failures)} problem(s)")
print("every run of A and B passed with the reference's losses: " + ", ".join(f"{c} {n}" for c, n in conditions))
