"""bench/exec/run.py [--memwall BUILD/memwall] [--nvme-dir DIR] [--steps N]: the executor's speed,
five ratios measured in one run (issues 12, 18, 26), each against a reference measured in the same run:

  1. training step, memwall's cpu backend vs PyTorch, the same GPT (4 layers, hidden 256, 4 heads,
     seq 64, bsz 16, fp32, activation checkpoint every block, AdamW) on the same threads:
         ratio = torch median step time / memwall median step time          target >= 1.0
  2. offload hidden by arithmetic intensity: zero_inf_cpu (parameters, gradients and optimizer
     states in CPU memory, fetched and offloaded per operator) against data_parallel (everything on
     the device) on the same model, bf16 parameters:
         ratio = data_parallel median step time / zero_inf_cpu median step  target >= 0.9
  3. the NVMe-resident optimizer step (zero_inf_nvme, 8 layers, hidden 512: 25 M parameters; 14 B
     read and 14 B written per parameter: fp32 master, momentum, variance and the bf16 gradient in,
     the same states and the bf16 parameter out) against what the drive and CPU Adam allow,
     fio (io_uring, O_DIRECT, 1 MiB, queue depth 32) and `memwall adam-bench` in the same run:
         bound  = min(fio read B/s / 14, fio write B/s / 14, CPU Adam params/s)
         ratio  = parameters / optimizer phase time / bound                   target >= 0.8
     (the optimizer phase: first start to last end of the optimizer-phase steps, results/METRICS.md)
  4. the optimizer overlapped with backward (issue 18): zero_inf_cpu and zero_inf_nvme, 8 layers,
     hidden 512, bsz 1, CPU Adam per chunk as soon as its gradients are final, against the paper's
     schedule (the optimizer after backward), same losses (asserted):
         ratio = median step with --optimizer-overlap none / with backward      target > 1.0
     On the CPU backend the "device" kernels and CPU Adam share the same cores, and the NVMe
     optimizer's reads share the drive with backward's parameter fetches: nothing is idle to hide
     the optimizer behind, so this ratio measures the overhead of the overlapped schedule here; the
     gain the simulator predicts needs a GPU beside idle CPU cores.
  5. gradient-norm clipping (issue 26, item 5): 8 layers, hidden 512, bsz 4, --grad-clip 1 against
     the same run unclipped, where the norm is taken on the device (zero3), in CPU memory
     (zero_inf_cpu) and from each final NVMe write's pinned copy (zero_inf_nvme):
         ratio = unclipped median step / clipped median step                  target >= 0.97
     (the clipped losses differ from the unclipped ones: it is asserted that they do)
Run with /usr/bin/python3 (Debian's python3-torch) on an idle machine; a benchmark, not a test.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--memwall", default=os.path.join(ROOT, "build", "memwall"))
ap.add_argument("--nvme-dir", default=None, help="folder on the drive for swap files and fio (default: a temp dir)")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--only", type=int, choices=(1, 2, 3, 4, 5), help="run one of the ratios")
args = ap.parse_args()
try:
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
except ImportError:
    sys.exit("bench/exec/run.py: cannot import torch; run with /usr/bin/python3 (Debian's python3-torch)")

THREADS = os.cpu_count()
L, C, NH, T, B = 4, 256, 4, 64, 16


def memwall_run(cfg, flags, steps):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        for k, v in cfg.items():
            f.write(f"{k}: {v}\n")
        path = f.name
    try:
        out = subprocess.run([args.memwall, "run", "--config", path, "--steps", str(steps), "--json"] + flags,
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return json.loads(out.splitlines()[-1])  # JSON Lines: the last line is the summary


def median_step(j):
    return statistics.median(s["iteration_s"] for s in j["steps"][2:])


base = {"layers": L, "hidden": C, "heads": NH, "seq": T, "bsz": B, "ci": 1, "lr": 1e-3, "capacity": "1 GiB"}


# ---- 1. memwall vs torch, one training step ----------------------------------------------------
def ratio1():
    mw_fp32 = memwall_run(dict(base, precision="fp32"), ["--strategy", "data_parallel"], args.steps)
    t_mw = median_step(mw_fp32)

    torch.manual_seed(0)
    torch.set_num_threads(THREADS)
    P = {"wte": torch.randn(256, C) * 0.02, "wpe": torch.randn(T, C) * 0.02}
    for l in range(L):
        p = f"b{l}."
        P[p + "ln1w"], P[p + "ln1b"] = torch.ones(C), torch.zeros(C)
        P[p + "qkvw"], P[p + "qkvb"] = torch.randn(3 * C, C) * 0.02, torch.zeros(3 * C)
        P[p + "projw"], P[p + "projb"] = torch.randn(C, C) * 0.02, torch.zeros(C)
        P[p + "ln2w"], P[p + "ln2b"] = torch.ones(C), torch.zeros(C)
        P[p + "fc1w"], P[p + "fc1b"] = torch.randn(4 * C, C) * 0.02, torch.zeros(4 * C)
        P[p + "fc2w"], P[p + "fc2b"] = torch.randn(C, 4 * C) * 0.02, torch.zeros(C)
    P["lnfw"], P["lnfb"] = torch.ones(C), torch.zeros(C)
    for v in P.values():
        v.requires_grad_(True)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))


    def block(x, l):
        p = f"b{l}."
        h = F.layer_norm(x, (C,), P[p + "ln1w"], P[p + "ln1b"], eps=1e-5)
        q, k, v = F.linear(h, P[p + "qkvw"], P[p + "qkvb"]).split(C, dim=2)
        q, k, v = [z.view(B, T, NH, C // NH).transpose(1, 2) for z in (q, k, v)]
        att = ((q @ k.transpose(-2, -1)) / (C // NH) ** 0.5).masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + F.linear((att @ v).transpose(1, 2).reshape(B, T, C), P[p + "projw"], P[p + "projb"])
        h = F.layer_norm(x, (C,), P[p + "ln2w"], P[p + "ln2b"], eps=1e-5)
        return x + F.linear(F.gelu(F.linear(h, P[p + "fc1w"], P[p + "fc1b"]), approximate="tanh"), P[p + "fc2w"],
                            P[p + "fc2b"])


    def step(idx, tgt, opt):
        opt.zero_grad()
        x = P["wte"][idx] + P["wpe"]
        for l in range(L):  # a checkpoint every block, as memwall's ci 1: blocks are recomputed in backward
            x = checkpoint(block, x, l, use_reentrant=False)
        x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], eps=1e-5)
        loss = F.cross_entropy((x @ P["wte"].t()).reshape(B * T, -1), tgt.reshape(-1))
        loss.backward()
        opt.step()


    opt = torch.optim.AdamW(list(P.values()), lr=1e-3, weight_decay=0.0)
    times = []
    for s in range(args.steps):
        idx = torch.randint(0, 256, (B, T))
        tgt = torch.randint(0, 256, (B, T))
        t0 = time.perf_counter()
        step(idx, tgt, opt)
        times.append(time.perf_counter() - t0)
    t_torch = statistics.median(times[2:])
    print(f"1. training step, {L} layers, hidden {C}, bsz {B} x seq {T}, fp32, ci 1, {THREADS} threads: "
          f"torch {t_torch * 1e3:.1f} ms, memwall {t_mw * 1e3:.1f} ms; torch / memwall = {t_torch / t_mw:.2f}x "
          f"(target >= 1.0)")


# ---- 2. zero_inf_cpu vs data_parallel ----------------------------------------------------------
def ratio2():
    dp = median_step(memwall_run(base, ["--strategy", "data_parallel"], args.steps))
    zc_json = memwall_run(base, ["--strategy", "zero_inf_cpu"], args.steps)
    zc = median_step(zc_json)
    print(f"2. same model, bf16 parameters: data_parallel {dp * 1e3:.1f} ms, zero_inf_cpu {zc * 1e3:.1f} ms "
          f"({100 * zc_json['hidden_fraction']:.0f} % of its transfer time hidden); data_parallel / zero_inf_cpu = "
          f"{dp / zc:.2f}x (target >= 0.9)")


# ---- 3. the NVMe-resident optimizer step -------------------------------------------------------
def ratio3():
    owned = args.nvme_dir is None
    nvme = args.nvme_dir or tempfile.mkdtemp(prefix="memwall-bench-")
    try:
        big = {"layers": 8, "hidden": 512, "heads": 8, "seq": 64, "bsz": 1, "ci": 1, "lr": 1e-3, "capacity": "1 GiB"}
        runs = [memwall_run(big, ["--strategy", "zero_inf_nvme", "--nvme-dir", nvme], 4) for _ in range(1)]
        n = runs[0]["params"]
        opt_s = statistics.median(s["iteration_s"] for s in runs[0]["steps"][1:])  # noqa: F841 (kept for the log)
        phase = runs[0]["phase_s"]["optimizer"]
        fio_file = os.path.join(nvme, "fio.tmp")
        bw = {}
        for rw in ("write", "read"):
            out = subprocess.run(["fio", f"--name={rw}", f"--filename={fio_file}", "--ioengine=io_uring", "--direct=1",
                                  f"--rw={rw}", "--bs=1M", "--size=1G", "--iodepth=32", "--numjobs=1",
                                  "--output-format=json"], check=True, capture_output=True, text=True).stdout
            job = json.loads(out)["jobs"][0][rw]
            bw[rw] = job["bw_bytes"]
        os.unlink(fio_file)
        adam = json.loads(subprocess.run([args.memwall, "adam-bench", "--params", str(n), "--grad-dtype", "bf16", "--json"],
                                         check=True, capture_output=True, text=True).stdout)
        adam_rate = adam["params_per_s"]
        bound = min(bw["read"] / 14, bw["write"] / 14, adam_rate)
        rate = n / phase
        print(f"3. optimizer step on NVMe, {n / 1e6:.1f} M params: {phase * 1e3:.0f} ms = {rate / 1e6:.0f} M params/s; "
              f"fio read {bw['read'] / 1e9:.2f} GB/s, write {bw['write'] / 1e9:.2f} GB/s, CPU Adam "
              f"{adam_rate / 1e6:.0f} M params/s: bound {bound / 1e6:.0f} M params/s; measured / bound = {rate / bound:.2f} "
              f"(target >= 0.8)")
    finally:
        if owned:
            subprocess.run(["rm", "-rf", nvme])


# ---- 4. the optimizer overlapped with backward ----------------------------------------------
def ratio4():
    big = {"layers": 8, "hidden": 512, "heads": 8, "seq": 64, "bsz": 1, "ci": 1, "lr": 1e-3, "capacity": "1 GiB"}
    nvme = args.nvme_dir or tempfile.mkdtemp(prefix="memwall-bench-")
    try:
        for strategy in ("zero_inf_cpu", "zero_inf_nvme"):
            flags = ["--strategy", strategy, "--nvme-dir", nvme, "--optimizer-overlap"]
            none = memwall_run(big, flags + ["none"], args.steps)
            back = memwall_run(big, flags + ["backward"], args.steps)
            losses = [s["loss"] for s in none["steps"]], [s["loss"] for s in back["steps"]]
            assert losses[0] == losses[1], f"backward overlap changed the losses: {losses}"
            t_none, t_back = median_step(none), median_step(back)
            print(f"4. optimizer beside backward, {strategy}, bsz 1, {none['params'] / 1e6:.1f} M params, {THREADS} "
                  f"threads: none {t_none * 1e3:.1f} ms, backward {t_back * 1e3:.1f} ms (optimizer phase "
                  f"{none['phase_s']['optimizer'] * 1e3:.0f} ms alone); none / backward = {t_none / t_back:.2f}x "
                  f"(target > 1.0; losses identical over {args.steps} steps)")
    finally:
        if args.nvme_dir is None:
            subprocess.run(["rm", "-rf", nvme])


# ---- 5. gradient-norm clipping ------------------------------------------------------------------
def ratio5():
    big = {"layers": 8, "hidden": 512, "heads": 8, "seq": 64, "bsz": 4, "ci": 1, "lr": 1e-3, "capacity": "1 GiB"}
    nvme = args.nvme_dir or tempfile.mkdtemp(prefix="memwall-bench-")
    try:
        for strategy in ("zero3", "zero_inf_cpu", "zero_inf_nvme"):
            flags = ["--strategy", strategy, "--nvme-dir", nvme]
            plain = memwall_run(big, flags, args.steps)
            clipped = memwall_run(big, flags + ["--grad-clip", "1"], args.steps)
            assert [s["loss"] for s in plain["steps"]] != [s["loss"] for s in clipped["steps"]], "nothing was clipped"
            t_plain, t_clip = median_step(plain), median_step(clipped)
            norms = [s["grad_norm"] for s in clipped["steps"]]
            print(f"5. gradient clipping, {strategy}, {plain['params'] / 1e6:.1f} M params: unclipped "
                  f"{t_plain * 1e3:.1f} ms, clipped {t_clip * 1e3:.1f} ms (norms {norms[0]:.2f} -> {norms[-1]:.2f}); "
                  f"unclipped / clipped = {t_plain / t_clip:.3f}x (target >= 0.97)")
    finally:
        if args.nvme_dir is None:
            subprocess.run(["rm", "-rf", nvme])


for n, f in ((1, ratio1), (2, ratio2), (3, ratio3), (4, ratio4), (5, ratio5)):
    if args.only in (None, n):
        f()
