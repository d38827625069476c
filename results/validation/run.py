#!/usr/bin/python3
"""results/validation: does the simulator predict the executor on this machine?

    results/validation/run.py [--memwall build/memwall] [--out results/validation]

Calibrates this machine (`memwall calibrate`), then runs `memwall validate` for each configuration
below: the executor runs the schedule for some iterations, the simulator replays the same schedule
on the calibrated profile, and the table records the measured median iteration time, the simulated
one and the error, with the phases. Writes calibrated.yaml, table.csv, table.md and plot.svg.
Run it on a quiet machine: anything else running slows the executor and not the simulator.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (label, run config, flags): every placement preset of the paper, tiling, offloaded checkpoints,
# and a model twice as deep and wide; all at dp 1 (one process).
SMALL = {"layers": 4, "hidden": 256, "heads": 4, "seq": 64, "bsz": 8}
LARGE = {"layers": 8, "hidden": 512, "heads": 8, "seq": 64, "bsz": 4}
CONFIGS = [
    ("data_parallel", SMALL, ["--strategy", "data_parallel"]),
    ("zero2", SMALL, ["--strategy", "zero2"]),
    ("zero3", SMALL, ["--strategy", "zero3"]),
    ("zero_offload", SMALL, ["--strategy", "zero_offload"]),
    ("zero_inf_cpu", SMALL, ["--strategy", "zero_inf_cpu"]),
    ("zero_inf_nvme", SMALL, ["--strategy", "zero_inf_nvme"]),
    ("zero_inf_nvme, tiling 4", SMALL, ["--strategy", "zero_inf_nvme", "--tiling", "4"]),
    ("zero_inf_cpu, checkpoints on cpu", SMALL, ["--strategy", "zero_inf_cpu", "--place", "act_ckpt=cpu"]),
    ("zero_inf_cpu, optimizer overlapped", SMALL, ["--strategy", "zero_inf_cpu", "--optimizer-overlap", "backward"]),
    ("8x512 zero_inf_cpu", LARGE, ["--strategy", "zero_inf_cpu"]),
    ("8x512 zero_inf_nvme", LARGE, ["--strategy", "zero_inf_nvme"]),
]
# Two data-parallel ranks (mpirun -np 2), against a profile calibrated under the same mpirun: both
# ranks share this machine's cores, as they do in training.
CONFIGS_DP2 = [
    ("dp 2, zero3", SMALL, ["--strategy", "zero3"]),
    ("dp 2, zero_inf_cpu", SMALL, ["--strategy", "zero_inf_cpu"]),
]
# Tensor slicing (Megatron-LM's, --mp 2): the two ranks of the same mpirun are one model's two slices,
# against the same 2-rank profile.
CONFIGS_MP2 = [
    ("mp 2, zero3", SMALL, ["--strategy", "zero3", "--mp", "2"]),
    ("mp 2, zero_inf_cpu", SMALL, ["--strategy", "zero_inf_cpu", "--mp", "2"]),
]
# Pipeline stages (--pp 2, 1F1B over 4 accumulated micro-steps; the tied embedding's copies on the
# two stages summed after their backward): the two ranks are the model's two stages, against the
# same 2-rank profile.
CONFIGS_PP2 = [
    ("pp 2 (4 micro-steps), zero3", SMALL, ["--strategy", "zero3", "--pp", "2", "--grad-accum", "4"]),
    ("pp 2 (4 micro-steps), zero_inf_cpu", SMALL, ["--strategy", "zero_inf_cpu", "--pp", "2", "--grad-accum", "4"]),
    # interleaved 1F1B: each stage two chunks of one block, the second stage's first chunk sending on
    # to the first stage's second
    ("pp 2 x v 2 interleaved (4 micro-steps), zero3", SMALL,
     ["--strategy", "zero3", "--pp", "2", "--virtual-stages", "2", "--grad-accum", "4"]),
    ("pp 2 x v 2 interleaved (4 micro-steps), zero_inf_cpu", SMALL,
     ["--strategy", "zero_inf_cpu", "--pp", "2", "--virtual-stages", "2", "--grad-accum", "4"]),
]
# All three at once, mp 2 x pp 2 x dp 2 (mpirun -np 8 on this machine's cores), against a profile
# calibrated under an 8-rank mpirun (gpu.shared_peak: the eight ranks' GEMMs at once).
CONFIGS_3D = [
    ("mp 2 x pp 2 x dp 2 (4 micro-steps), zero3", SMALL,
     ["--strategy", "zero3", "--mp", "2", "--pp", "2", "--grad-accum", "4"]),
    ("mp 2 x pp 2 x dp 2 (4 micro-steps), zero_inf_cpu", SMALL,
     ["--strategy", "zero_inf_cpu", "--mp", "2", "--pp", "2", "--grad-accum", "4"]),
]


def mpirun(ranks):
    return ["mpirun", "-np", str(ranks), "--oversubscribe", "--mca", "btl", "self,vader"] if ranks > 1 else []


def write_config(path, shape):
    with open(path, "w") as f:
        for k, v in shape.items():
            f.write(f"{k}: {v}\n")
        f.write("steps: 10\nci: 1\nlr: 3e-3\nseed: 1337\nbackend: cpu\ncompute: fp32\n")


def svg_plot(rows, path):
    """Measured and simulated iteration time per configuration, as horizontal bar pairs."""
    w, left, bar, gap = 760, 250, 9, 8
    top = 40
    h = top + len(rows) * (2 * bar + gap) + 40
    vmax = max(max(r["measured_ms"], r["simulated_ms"]) for r in rows) * 1.1
    scale = (w - left - 80) / vmax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w/2}" y="18" text-anchor="middle" font-size="13">memwall validate: measured vs simulated '
           f'iteration time (this machine, cpu backend)</text>',
           f'<rect x="{left}" y="26" width="10" height="8" fill="#4477aa"/><text x="{left+14}" y="34">measured</text>',
           f'<rect x="{left+90}" y="26" width="10" height="8" fill="#ee8866"/><text x="{left+104}" y="34">simulated</text>']
    y = top
    for r in rows:
        out.append(f'<text x="{left-6}" y="{y+bar+3}" text-anchor="end">{r["config"]}</text>')
        for i, (key, color) in enumerate((("measured_ms", "#4477aa"), ("simulated_ms", "#ee8866"))):
            out.append(f'<rect x="{left}" y="{y+i*bar}" width="{r[key]*scale:.1f}" height="{bar-1}" fill="{color}"/>')
        out.append(f'<text x="{left+max(r["measured_ms"], r["simulated_ms"])*scale+4:.1f}" y="{y+bar+3}">'
                   f'{r["error_pct"]:+.1f} %</text>')
        y += 2 * bar + gap
    axis = y + 10
    out.append(f'<line x1="{left}" y1="{axis}" x2="{left+vmax*scale:.1f}" y2="{axis}" stroke="black"/>')
    step = 100 if vmax > 400 else 50
    t = 0
    while t <= vmax:
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{axis}" x2="{x:.1f}" y2="{axis+4}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{axis+16}" text-anchor="middle">{t} ms</text>')
        t += step
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memwall", default=os.path.join(ROOT, "build", "memwall"))
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--steps", type=int, default=12, help="iterations per configuration (the first is warm-up)")
    a = ap.parse_args()
    mw = a.memwall
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with tempfile.TemporaryDirectory(prefix="memwall-validation-") as tmp:
        profiles = {r: os.path.join(a.out, "calibrated.yaml" if r == 1 else f"calibrated-{r}-ranks.yaml")
                    for r in (1, 2, 8)}
        for ranks, profile in profiles.items():
            print(f"calibrating ({ranks} rank{'s' if ranks > 1 else ''}) ...", flush=True)
            subprocess.run(mpirun(ranks) +
                           [mw, "calibrate", "--nvme-dir", tmp, "--device-memory", "256MiB", "--name",
                            f"this-machine-{ranks}", "-o", profile], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env)
        rows = []
        for ranks, label, shape, flags in ([(1, *c) for c in CONFIGS] + [(2, *c) for c in CONFIGS_DP2] +
                                           [(2, *c) for c in CONFIGS_MP2] + [(2, *c) for c in CONFIGS_PP2] +
                                           [(8, *c) for c in CONFIGS_3D]):
            cfg = os.path.join(tmp, "run.yaml")
            write_config(cfg, shape)
            cmd = mpirun(ranks) + [
                mw, "validate", "--profile", profiles[ranks], "--config", cfg, "--steps", str(a.steps), "--json",
                "--nvme-dir", tmp] + flags
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                sys.exit(f"{label}: {' '.join(cmd)} failed: {r.stderr.strip()}")
            j = json.loads(r.stdout.splitlines()[-1])  # JSON Lines: the summary is the last line
            it = j["iteration_s"]
            ph = j["phase_s"]
            mp = int(flags[flags.index("--mp") + 1]) if "--mp" in flags else 1
            pp = int(flags[flags.index("--pp") + 1]) if "--pp" in flags else 1
            row = {"config": label, "dp": ranks // (mp * pp), "mp": mp, "pp": pp,
                   "model": f'{shape["layers"]}x{shape["hidden"]}, bsz {shape["bsz"]}' +
                            (", untied head" if shape.get("tied_embeddings") == "false" else ""),
                   "measured_ms": round(1e3 * it["measured"], 2),
                   "simulated_ms": round(1e3 * it["simulated"], 2),
                   "error_pct": round(it["error_pct"], 1),
                   # how far apart the steady iterations ran (slowest - fastest over the median)
                   "measured_spread_pct": round(it["measured_spread_pct"], 1)}
            for p in ("forward", "recompute", "backward", "optimizer"):
                m = ph.get(p, {"measured": 0, "simulated": 0})
                row[f"{p}_measured_ms"] = round(1e3 * m["measured"], 2)
                row[f"{p}_simulated_ms"] = round(1e3 * m["simulated"], 2)
            rows.append(row)
            print(f'{label:40s} measured {row["measured_ms"]:8.1f} ms  simulated {row["simulated_ms"]:8.1f} ms  '
                  f'{row["error_pct"]:+6.1f} %', flush=True)
    with open(os.path.join(a.out, "table.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write("| configuration | model | measured | simulated | error |\n|---|---|---|---|---|\n")
        for r in rows:
            f.write(f'| {r["config"]} | {r["model"]} | {r["measured_ms"]:.1f} ms | {r["simulated_ms"]:.1f} ms | '
                    f'{r["error_pct"]:+.1f} % |\n')
    svg_plot(rows, os.path.join(a.out, "plot.svg"))
    within = sum(abs(r["error_pct"]) <= 10 for r in rows)
    print(f"{within} of {len(rows)} configurations within 10 %")


if __name__ == "__main__":
    main()
