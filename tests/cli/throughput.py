"""throughput.py MEMWALL RUN_YAML: the throughput fields of analyze, simulate, plan and run
(results/METRICS.md, "Throughput and utilisation") against the definitions, computed here again from
each report's own numbers and a parameter count written out for memwall's GPT (the operator graph
counts the same; run's `params` is the engine's tensors, so this also ties the two together)."""
import json
import subprocess
import sys

mw, run_yaml = sys.argv[1], sys.argv[2]
failures = []


def check(what, got, want, rel=1e-9):
    if not abs(got - want) <= rel * max(abs(want), 1e-300):
        failures.append(f"{what}: got {got!r}, expected {want!r}")


def memwall(*args):
    out = subprocess.run([mw, *args], check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    return json.loads(lines[-1]) if lines[0].startswith('{"type"') else json.loads(out)


def params(L, C, V, T):  # every block's weights and biases, two norms each; embeddings; the final norm
    return L * (12 * C * C + 13 * C) + V * C + T * C + 2 * C


def model_flops_per_token(L, C, V, T):  # PaLM: 6N + 12 L C T
    return 6 * params(L, C, V, T) + 12 * L * C * T


DGX2_DATASHEET = 125e12

# simulate: 4 blocks of 1024 on dgx2's 16 GPUs
L, C, T, V = 4, 1024, 1024, 50257
s = memwall("simulate", "--profile", "dgx2", "--layers", str(L), "--hidden", str(C), "--heads", "16",
            "--strategy", "zero_inf_cpu", "--bsz", "2", "--json", "--tokens", "1e9")
check("simulate tokens_per_step", s["tokens_per_step"], 2 * 16 * T)
check("simulate tokens_per_s", s["tokens_per_s"], 2 * 16 * T / s["iteration_s"])
check("simulate hardware TFLOPS = its TFLOPS per GPU", s["hardware_tflops_per_gpu"], s["tflops_per_gpu"])
check("simulate mfu", s["mfu"], s["tokens_per_s"] * model_flops_per_token(L, C, V, T) / 16 / DGX2_DATASHEET)
check("simulate hfu", s["hfu"], s["tflops_per_gpu"] * 1e12 / DGX2_DATASHEET)
check("simulate train_s", s["train_s"], 1e9 / s["tokens_per_s"])
if s["mfu_peak"] != "gpu.datasheet_peak":
    failures.append(f"simulate mfu_peak: {s['mfu_peak']}")

# plan: the throughput of the time that ranked it, at its global batch
p = memwall("plan", "--profile", "dgx2", "--layers", str(L), "--hidden", str(C), "--heads", "16", "--json")
tp = p["throughput"]
check("plan tokens_per_s", tp["tokens_per_s"], p["samples_per_s"] * T, rel=1e-6)
check("plan train_tokens (20 per parameter)", tp["train_tokens"], 20 * params(L, C, V, T))
if tp["from"] != p["ranked_by"]:
    failures.append(f"plan throughput from {tp['from']}, ranked by {p['ranked_by']}")

# analyze: the ceiling computes at the achievable peak, so its HFU is achievable / datasheet
a = memwall("analyze", "--model", "fig2a-1T", "--json")
check("analyze ceiling hfu", a["throughput_ceiling"]["hfu"], a["peak_flops_per_s"] / DGX2_DATASHEET)
if not 0 < a["throughput_ceiling"]["mfu"] < a["throughput_ceiling"]["hfu"]:
    failures.append(f"analyze ceiling: mfu {a['throughput_ceiling']['mfu']} not in (0, hfu)")

# run: 3 steps of the shipped 2-layer GPT (byte-level: vocab 256, seq 64, bsz 8)
r = memwall("run", "--config", run_yaml, "--steps", "3", "--strategy", "zero3", "--json")
L, C, T, V = 2, 128, 64, 256
check("run params (engine) = the count of the graph's GPT", r["params"], params(L, C, V, T))
tp = r["throughput"]
check("run tokens_per_step", tp["tokens_per_step"], r["global_batch"] * T)
check("run tokens_per_s", tp["tokens_per_s"], r["global_batch"] * T / r["iteration_s_median"])
check("run model TFLOPS", tp["model_tflops_per_gpu"] * 1e12,
      r["global_batch"] * T * model_flops_per_token(L, C, V, T) / r["dp"] / r["iteration_s_median"])
if tp["mfu_peak"] != "gpu.peak":  # local-cpu has no datasheet peak
    failures.append(f"run mfu_peak: {tp['mfu_peak']}")

# a bad --tokens is one line, exit 2, before anything runs
bad = subprocess.run([mw, "run", "--config", run_yaml, "--tokens", "lots"], capture_output=True, text=True)
if bad.returncode != 2 or "--tokens" not in bad.stderr or bad.stderr.count("\n") != 1:
    failures.append(f"run --tokens lots: exit {bad.returncode}, stderr {bad.stderr!r}")

if failures:
    sys.exit("\n".join(failures))
print("throughput fields of analyze, simulate, plan and run match their definitions")
