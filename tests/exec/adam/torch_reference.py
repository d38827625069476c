"""torch_reference.py ADAM_REF_TOOL: memwall's CPU Adam against torch.optim.Adam / AdamW.

Run with /usr/bin/python3 (Debian's python3-torch); installs nothing. For every case and every
ISA path the CPU runs (the tool is told which one to use), 10 steps on random tensors are run by
torch and by adam_ref_tool, exchanging raw little-endian arrays through a temporary directory.

Tolerances, per fp32 state tensor X in {param, exp_avg, exp_avg_sq} after the last step:
  rel_i = |x_i - r_i| / max(|r_i|, rms(r)),   max_i rel_i <= 1e-6
i.e. the ordinary relative error for elements at least as large as the tensor's RMS, and the error
relative to the RMS for smaller ones: those are small through cancellation (exp_avg of gradients
of both signs), where one ulp of an input is a large fraction of the result and a pure relative
error measures the rounding of the inputs, not the update. memwall rounds every operation as
torch's ATen AVX2 kernels do, so on such machines the results are bit-identical; the script prints
how many elements differ in any bit.
The 16-bit copy must equal torch's .to(bfloat16/float16) of memwall's fp32 result bit for bit,
except that a NaN need only stay a NaN (torch itself gives 0x7FC0 in scalar code and 0xFFFF in
its vector code for the same NaN). Special values (NaN, inf, subnormals, ties, overflow) are
checked through the tool's `convert` mode.
"""
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    sys.exit("torch_reference.py: cannot import torch; run with /usr/bin/python3 after ./setup.sh "
             "(Debian's python3-torch)")

TOOL = sys.argv[1]
STEPS = 10
REL_TOL = 1e-6
SIZES = [1, 7, 15, 17, 33, 1000, 40001]  # not multiples of 8 or 16; 40001 splits over threads
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
failures = []
checked = 0


def case(name, **kw):
    c = dict(name=name, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
             decoupled=False, grad="fp32", copy="bf16", loss_scale=1.0, max_norm=None,
             first_step=1, grad_scale=1.0)
    c.update(kw)
    return c


CASES = [
    case("adam"),
    case("adam_l2_fp16grad_fp16copy", weight_decay=0.01, grad="fp16", copy="fp16"),
    case("adamw_bf16grad", weight_decay=0.1, decoupled=True, grad="bf16"),
    # Loss scale and clipping (GradScaler.unscale_ then clip_grad_norm_), large lr and eps so the
    # placement of eps and the bias corrections show in the parameters.
    case("adamw_scaled_clipped", weight_decay=0.01, decoupled=True, copy="fp16", lr=0.05, eps=1e-3,
         beta2=0.99, loss_scale=1024.0, max_norm=0.5, grad_scale=1024.0),
    case("adam_l2_fp16grad_scaled", weight_decay=0.01, grad="fp16", loss_scale=65536.0, max_norm=2.0,
         grad_scale=4096.0),
    # Resumed from step 990 with nonzero state; no copy.
    case("adam_resumed", weight_decay=0.01, first_step=991, copy="none"),
    # Gradients over ten orders of magnitude.
    case("adam_wide_range", lr=0.1, eps=1e-6, grad_scale="wide"),
]


def raw_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()  # numpy has no bfloat16


def write(path, t):
    with open(path, "wb") as f:
        f.write(raw_bytes(t))


def read(path, dtype, n):
    raw = torch.from_file(path, size=n * torch.tensor([], dtype=dtype).element_size(), dtype=torch.uint8)
    return raw.view(dtype).clone()


def make_inputs(c, n, gen):
    p0 = torch.randn(n, generator=gen)
    if c["first_step"] > 1:
        m0 = torch.randn(n, generator=gen) * 1e-2
        v0 = torch.rand(n, generator=gen) * 1e-4
    else:
        m0 = torch.zeros(n)
        v0 = torch.zeros(n)
    grads = []
    for _ in range(STEPS):
        g = torch.randn(n, generator=gen)
        if c["grad_scale"] == "wide":
            g = g * torch.pow(10.0, torch.rand(n, generator=gen) * 10 - 8)
        else:
            g = g * c["grad_scale"]
        grads.append(g.to(TORCH_DTYPE[c["grad"]]))
    return p0, m0, v0, grads


def torch_run(c, p0, m0, v0, grads, foreach):
    p = torch.nn.Parameter(p0.clone())
    cls = torch.optim.AdamW if c["decoupled"] else torch.optim.Adam
    opt = cls([p], lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
              weight_decay=c["weight_decay"], foreach=foreach)
    if c["first_step"] > 1:
        opt.state[p] = {"step": torch.tensor(float(c["first_step"] - 1)),
                        "exp_avg": m0.clone(), "exp_avg_sq": v0.clone()}
    clip_coefs = []
    inv_scale = torch.tensor(c["loss_scale"], dtype=torch.float64).reciprocal().float()  # GradScaler
    for g16 in grads:
        p.grad = g16.to(torch.float32, copy=True)  # .float() of an fp32 tensor is the tensor itself
        p.grad.mul_(inv_scale)
        coef = 1.0
        if c["max_norm"] is not None:
            total = torch.nn.utils.clip_grad_norm_([p], c["max_norm"])
            coef = torch.clamp(c["max_norm"] / (total + 1e-6), max=1.0).item()  # what clip_grad_norm_ multiplied by
        clip_coefs.append(coef)
        opt.step()
    st = opt.state[p]
    return p.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone(), clip_coefs


def rel_err(x, r):
    rms = math.sqrt(float((r.double() ** 2).mean()))
    denom = torch.clamp(r.double().abs(), min=rms if rms > 0 else 1e-300)
    return float(((x.double() - r.double()).abs() / denom).max())


def bits_differ(x, r):
    return int((x.view(torch.int32) != r.view(torch.int32)).sum())


def half_mismatches(mine16, ref_fp32, dtype_name):
    ref = ref_fp32.to(TORCH_DTYPE[dtype_name])
    ref_bits = ref.view(torch.int16)
    mine_bits = mine16.view(torch.int16)
    mine_nan = mine16.view(TORCH_DTYPE[dtype_name]).float().isnan()
    ref_nan = ref.float().isnan()
    bad = (mine_nan != ref_nan) | (~ref_nan & (mine_bits != ref_bits))
    return int(bad.sum())


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def run_tool(args):
    r = subprocess.run([TOOL] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"adam_ref_tool {' '.join(args)}: {r.stderr.strip()}")


def check_adam(c, isa, threads, n, tmp, gen_seed):
    global checked
    gen = torch.Generator().manual_seed(gen_seed)
    p0, m0, v0, grads = make_inputs(c, n, gen)
    ref = torch_run(c, p0, m0, v0, grads, foreach=False)
    ref_fe = torch_run(c, p0, m0, v0, grads, foreach=True)
    clip_coefs = ref[3]
    write(f"{tmp}/param.bin", p0)
    write(f"{tmp}/exp_avg.bin", m0)
    write(f"{tmp}/exp_avg_sq.bin", v0)
    with open(f"{tmp}/grads.bin", "wb") as f:
        for g in grads:
            f.write(raw_bytes(g))
    run_tool(["adam", f"isa={isa}", f"threads={threads}", f"n={n}", f"steps={STEPS}",
              f"first_step={c['first_step']}", f"lr={c['lr']!r}", f"beta1={c['beta1']!r}",
              f"beta2={c['beta2']!r}", f"eps={c['eps']!r}", f"weight_decay={c['weight_decay']!r}",
              f"decoupled={int(c['decoupled'])}", f"grad={c['grad']}", f"copy={c['copy']}",
              f"loss_scale={c['loss_scale']!r}", "clip_coefs=" + ",".join(repr(x) for x in clip_coefs),
              f"dir={tmp}"])
    label = f"{c['name']} isa={isa} threads={threads} n={n}"
    worst = 0.0
    differ = 0
    for i, name in enumerate(["param", "exp_avg", "exp_avg_sq"]):
        mine = read(f"{tmp}/out_{name}.bin", torch.float32, n)
        for which, r in (("torch", ref[i]), ("torch foreach", ref_fe[i])):
            e = rel_err(mine, r)
            worst = max(worst, e)
            if not e <= REL_TOL:
                fail(f"{label}: {name}: max relative error {e:.3g} vs {which} > {REL_TOL}")
        differ += bits_differ(mine, ref[i])
    if c["copy"] != "none":
        mine_param = read(f"{tmp}/out_param.bin", torch.float32, n)
        mine16 = read(f"{tmp}/out_param16.bin", torch.int16, n)
        bad = half_mismatches(mine16, mine_param, c["copy"])
        if bad:
            fail(f"{label}: {c['copy']} copy: {bad} of {n} elements differ from torch's conversion")
    checked += 1
    return worst, differ


def check_convert(isa, tmp):
    """Special values and random bit patterns through the copy's conversion, against torch."""
    global checked
    specials = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), -float("nan"),
                65504.0, 65519.0, 65520.0, 1e6, -1e6, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001,
                2.0 ** -14, 2.0 ** -15, 1e-40, -1e-40, 1.17549435e-38, 3.4028235e38]
    s = torch.tensor(specials, dtype=torch.float32)
    # bf16 ties (low 16 bits 0x8000, either parity), fp16 ties, and NaN payloads, as bit patterns.
    patterns = torch.tensor([0x3F808000, 0x3F818000, 0x3F80_7FFF, 0x3F80_8001, 0x7F80_0001, 0xFFC1_2345,
                             0x7FFF_FFFF, 0x0000_8000, 0x0001_8000, 0x3F80_1000, 0x3F80_3000,
                             0x3F80_2000, 0x3380_0000, 0x3300_0000, 0x7F7F_FFFF], dtype=torch.int64)
    pat = patterns.to(torch.int32).view(torch.float32)
    rnd = torch.randint(-2 ** 31, 2 ** 31 - 1, (100_003,), generator=torch.Generator().manual_seed(7),
                        dtype=torch.int64).to(torch.int32).view(torch.float32)
    src = torch.cat([s, pat, rnd, torch.randn(50_000) * 100])
    n = src.numel()
    write(f"{tmp}/src.bin", src)
    for dt in ("bf16", "fp16"):
        run_tool(["convert", f"isa={isa}", f"dtype={dt}", f"n={n}", f"dir={tmp}"])
        mine16 = read(f"{tmp}/out_param16.bin", torch.int16, n)
        bad = half_mismatches(mine16, src, dt)
        if bad:
            fail(f"convert isa={isa} {dt}: {bad} of {n} values differ from torch's .to()")
        checked += 1


def main():
    torch.set_num_threads(1)
    isas = subprocess.run([TOOL, "isas"], capture_output=True, text=True, check=True).stdout.split()
    print("ISA paths on this CPU:", ", ".join(isas))
    runs = [(isa, 2) for isa in isas] + [("scalar", 1)]
    with tempfile.TemporaryDirectory() as tmp:
        for isa in isas:
            check_convert(isa, tmp)
        for ci, c in enumerate(CASES):
            for isa, threads in runs:
                worst, differ, total = 0.0, 0, 0
                for n in SIZES:
                    w, d = check_adam(c, isa, threads, n, tmp, gen_seed=1000 * ci + n)
                    worst, differ, total = max(worst, w), differ + d, total + 3 * n
                print(f"{c['name']:28s} {isa:6s} threads={threads}: max rel err {worst:.2e}, "
                      f"{differ} of {total} fp32 state values not bit-identical to torch")
    print(f"{checked} comparisons, {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
