"""bench/adam/run.py: memwall's CPU Adam against torch.optim.Adam and the memory-bandwidth bound.

    /usr/bin/python3 bench/adam/run.py [--params 100M] [--dtype bf16|fp16] [--memwall build/memwall]
                                       [--repeats 10] [--threads 0]

Measures, in one run and on the same number of parameters (fp32 state):
  1. `memwall adam-bench --json`: memwall's Adam step (16-bit copy written in the same pass) and
     its STREAM-style triad (a = b + s*c, non-temporal stores, 12 B/element); the memory-bandwidth
     bound is triad bandwidth / bytes per parameter (results/METRICS.md, "## CPU Adam").
  2. a triad in torch (torch.add(b, c, alpha=s, out=a): ordinary stores, also counted 12 B/element
     although the store's write-allocate moves 16), for reference;
  3. torch.optim.Adam (default hyperparameters, as memwall's bench uses) with foreach=False and
     foreach=True (torch 1.13 has no fused CPU Adam); the faster is the baseline. Also shown: that
     step plus the 16-bit copy torch would need to produce what memwall produces (p16.copy_(p)).
Prints all of them and the ratios memwall / torch and memwall / memory bound. Times are the best
of --repeats after one warm-up, for every row (STREAM's convention); with --rounds R the three
measurements alternate R times and each keeps its best, so a burst of load from other programs
does not land on one side only. Not a test: run it by hand.
Debian's python3-torch imports only from /usr/bin/python3.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_count(text):
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    t = text.strip()
    if t and t[-1].upper() in mult:
        return int(float(t[:-1]) * mult[t[-1].upper()])
    return int(float(t))


def best_time(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def torch_triad(n, repeats):
    b = torch.rand(n)
    c = torch.rand(n)
    a = torch.empty(n)
    s = best_time(lambda: torch.add(b, c, alpha=3.0, out=a), repeats)
    return 12.0 * n / s


def torch_adam(n, dtype, repeats):
    """Best step time of torch.optim.Adam per foreach setting, and of the faster one plus the copy."""
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, generator=gen) * 0.05)
    p.grad = torch.randn(n, generator=gen) * 1e-2
    p16 = torch.empty(n, dtype=dtype)
    out = {}
    for foreach in (False, True):
        opt = torch.optim.Adam([p], foreach=foreach)
        out[foreach] = best_time(opt.step, repeats)
        del opt
    fastest = min(out, key=out.get)
    opt = torch.optim.Adam([p], foreach=fastest)

    def step_and_copy():
        opt.step()
        p16.copy_(p.detach())

    with_copy = best_time(step_and_copy, repeats)
    return out, fastest, with_copy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="100M")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--memwall", default=os.path.join(ROOT, "build", "memwall"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores (memwall and torch alike)")
    ap.add_argument("--rounds", type=int, default=2, help="alternate memwall and torch this many times")
    args = ap.parse_args()
    n = parse_count(args.params)
    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)

    cmd = [args.memwall, "adam-bench", "--params", str(n), "--dtype", args.dtype, "--repeats",
           str(args.repeats), "--threads", str(threads), "--json"]
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    mw = triad_torch_Bps = torch_times = torch_with_copy_s = None
    for _ in range(args.rounds):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"bench/adam/run.py: {' '.join(cmd)} failed: {r.stderr.strip()}")
        m = json.loads(r.stdout)
        if mw is None:
            mw = m
        else:  # best of rounds, each of memwall's two measurements on its own
            if m["params_per_s"] > mw["params_per_s"]:
                mw.update({k: m[k] for k in ("adam_best_s", "params_per_s", "adam_Bps")})
            if m["triad_Bps"] > mw["triad_Bps"]:
                mw.update({k: m[k] for k in ("triad_best_s", "triad_Bps", "memory_bound_params_per_s")})
        triad_torch_Bps = max(triad_torch_Bps or 0, torch_triad(n, args.repeats))
        times, _, with_copy = torch_adam(n, half, args.repeats)
        torch_times = times if torch_times is None else {k: min(v, times[k]) for k, v in torch_times.items()}
        torch_with_copy_s = min(torch_with_copy_s or 1e30, with_copy)
    fastest = min(torch_times, key=torch_times.get)
    torch_pps = n / torch_times[fastest]
    torch_copy_pps = n / torch_with_copy_s
    mw_pps = mw["params_per_s"]
    bound_pps = mw["memory_bound_params_per_s"]
    bpp = mw["bytes_per_param"]

    def row(name, secs, pps, extra=""):
        print(f"  {name:50s} {secs * 1e3:8.1f} ms  {pps / 1e6:8.0f} M params/s  {extra}")

    print(f"CPU Adam, {n / 1e6:g} M params, fp32 state and gradients, {args.dtype} copy, {threads} threads, "
          f"best of {args.repeats} x {args.rounds} rounds; torch {torch.__version__}, memwall isa {mw['isa']}")
    print(f"  {'triad a = b + s*c (memwall, non-temporal)':50s} {mw['triad_Bps'] / 1e9:8.1f} GB/s  "
          f"(12 B/elem) -> bound {bound_pps / 1e6:.0f} M params/s at {bpp:g} B/param")
    print(f"  {'triad a = b + s*c (torch.add out=)':50s} {triad_torch_Bps / 1e9:8.1f} GB/s  (12 B/elem counted)")
    for fe in (False, True):
        row(f"torch.optim.Adam foreach={fe}", torch_times[fe], n / torch_times[fe],
            "<- baseline" if fe == fastest else "")
    row(f"torch.optim.Adam (faster) + copy_ to {args.dtype}", torch_with_copy_s, torch_copy_pps)
    row("memwall adam-bench (copy in the same pass)", mw["adam_best_s"], mw_pps,
        f"{mw['adam_Bps'] / 1e9:.1f} GB/s at {bpp:g} B/param")
    print("ratios:")
    print(f"  memwall / torch.optim.Adam           {mw_pps / torch_pps:6.2f} x   (target >= 2.5 x)")
    print(f"  memwall / torch.optim.Adam + copy    {mw_pps / torch_copy_pps:6.2f} x")
    print(f"  memwall / memory-bandwidth bound     {100 * mw_pps / bound_pps:6.1f} %   (target >= 75 %)")


if __name__ == "__main__":
    main()
