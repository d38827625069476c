"""torch_reference.py GPT_REF_TOOL [BACKEND [STRATEGY]] [--kind K]: memwall's GPT trained by its engine
(exec/engine running the schedule, fp32, by default zero_inf_nvme: parameters, gradients and
optimizer states through real swap files) against the same GPT in PyTorch.

--kind llama: the Llama block (RMSNorm, rotary attention with 2 key/value heads for 4 query heads,
SwiGLU, an untied LM head, no biases); --kind mixed: multi-query attention with a head size of 12 (q
48 channels wide on a 32-channel model, as Mistral NeMo's 32 x 128 on 5120), GeGLU, LayerNorm,
rotary, tied, biases on qkv only. The reference is plain torch (no transformers library): RMSNorm as
x * rsqrt(mean(x^2) + 1e-5) * w, rotary positions as Hugging Face's Llama writes them (rotate_half,
cos/sin of t * theta^(-2i/hs)), key/value heads repeated over their query heads, SiLU(gate) * up.
For a kind other than gpt the same 10 steps also run under every placement preset and with tiling 2,
and their losses must equal the default run's (rel 1e-6).

Run with /usr/bin/python3 (Debian's python3-torch); installs nothing. For each checkpoint interval
ci in CIS (0: one checkpoint, the whole stack recomputed) the tool trains a tiny GPT (3 layers,
C 32, 4 heads, T 16, B 3, V 256) for 10 AdamW steps and writes its initial parameters, batches,
the logits, loss and gradients of the first step, and every step's loss.
This script loads the same parameters into torch and checks, with stated tolerances:

  logits, every parameter's gradient (per tensor X against torch's R, torch in float64):
      rel(X) = max|X - R| / max|R|                               <= 1e-4
  loss of batch 0 and the losses of 10 AdamW(lr 1e-2, wd 0) steps, torch in float32
      (memwall's CPU Adam rounds as torch's does, so the runs track each other closely):
      |x - r| / |r|                                              <= 1e-4
  and gradients with checkpoints every block or every two (ci = 1, 2) equal those with one
  checkpoint (ci = 0) bit for bit on the cpu backend (recompute runs the same kernels on the same
  inputs); on cuda within rel 1e-6.
Second argument: the backend (cpu, the default, or cuda; exit 77 = skipped, no device); third: the
strategy (a placement preset).

--mp N: the tool runs under mpirun -np N with the model in N tensor slices (Megatron-LM's
column-parallel qkv and fc1, row-parallel proj and fc2, heads split); the slices' parameters and
gradients are put back in the whole model's places (each slice says where its elements sit) and the
same checks hold against the unsliced torch model: the initial parameters are the whole model's,
every gradient within rel 1e-4, the logits and the 10 steps' losses.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("torch_reference.py: cannot import torch; run with /usr/bin/python3 after ./setup.sh "
             "(Debian's python3-torch)")

ARGS = [a for a in sys.argv[1:]]
KIND = "gpt"
MP = 1
if "--mp" in ARGS:
    i = ARGS.index("--mp")
    MP = int(ARGS[i + 1])
    del ARGS[i:i + 2]
if "--kind" in ARGS:
    i = ARGS.index("--kind")
    KIND = ARGS[i + 1]
    del ARGS[i:i + 2]
TOOL = ARGS[0] if len(ARGS) > 0 else None
BACKEND = ARGS[1] if len(ARGS) > 1 else "cpu"
STRATEGY = ARGS[2] if len(ARGS) > 2 else "zero_inf_nvme"
PRESETS = ["data_parallel", "zero2", "zero_offload", "zero3", "zero_inf_cpu", "zero_inf_nvme", "three_d", "l2l"]
CIS = [0, 1, 2]
GRAD_TOL = 1e-4
LOSS_TOL = 1e-4
failures = []


MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader"]


def assembled(d, name, mp, n):
    """The whole model's array from the slices' parts: each slice writes its elements and their
    places in the whole (an element every slice holds whole is written alike by each)."""
    whole = np.full(n, np.nan, dtype=np.float32)
    for r in range(mp):
        at = np.fromfile(os.path.join(d, f"index.rank{r}.bin"), dtype=np.uint64).astype(np.int64)
        whole[at] = np.fromfile(os.path.join(d, f"{name}.rank{r}.bin"), dtype=np.float32)
    if np.isnan(whole).any():
        sys.exit(f"torch_reference.py: {int(np.isnan(whole).sum())} elements of {name} held by no slice")
    return whole


def run_tool(ci, d, tool=None, backend=None, strategy=None, extra=()):
    cmd = [tool or TOOL, d, str(ci), backend or BACKEND, strategy or STRATEGY, *extra, f"--kind={KIND}"]
    if MP > 1:
        cmd = MPIRUN + ["-np", str(MP)] + cmd + [f"--mp={MP}"]
    rc = subprocess.run(cmd).returncode
    if rc == 77:
        print(f"torch_reference.py: SKIPPED: the {BACKEND} backend has no device here")
        sys.exit(77)
    if rc != 0:
        sys.exit(f"torch_reference.py: gpt_ref_tool failed with exit code {rc}")
    meta = json.load(open(os.path.join(d, "meta.json")))
    f32 = lambda n: np.fromfile(os.path.join(d, n), dtype=np.float32)
    i32 = lambda n: np.fromfile(os.path.join(d, n), dtype=np.int32)
    if MP > 1:
        n = sum(t["elems"] for t in meta["tensors"])
        params, grads = assembled(d, "params", MP, n), assembled(d, "grads", MP, n)
    else:
        params, grads = f32("params.bin"), f32("grads.bin")
    return meta, params, grads, f32("logits.bin"), i32("tokens.bin"), i32("targets.bin")


def unpack(meta, flat, dtype):
    out = {}
    for t in meta["tensors"]:
        a = torch.tensor(flat[t["offset"]:t["offset"] + t["elems"]].reshape(t["shape"]), dtype=dtype)
        out[t["name"]] = a.requires_grad_(True)
    return out


def rotary(x, theta):
    """Hugging Face Llama's apply_rotary_pos_emb on (B, heads, T, hs): rotate_half pairs (i, i + hs/2)."""
    T, hs = x.shape[2], x.shape[3]
    inv = theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., :hs // 2], x[..., hs // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def gpt_forward(meta, P, idx, targets):
    """The model of exec/gpt/gpt.cpp, written with torch's own operators."""
    B, T = idx.shape
    C, NH, L = meta["hidden"], meta["heads"], meta["layers"]
    KVH = meta.get("kv_heads", NH)
    hs = meta.get("head_dim", C // NH)
    A = NH * hs  # q's and the context's channels (C unless the head size is given)
    I = meta.get("intermediate", 4 * C)
    ffn, rms = meta.get("ffn", "gelu"), meta.get("norm", "layernorm") == "rmsnorm"
    rope = meta.get("positions", "learned") == "rotary"

    def norm(x, name):
        if rms:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * P[name + ".weight"]
        return F.layer_norm(x, (C,), P[name + ".weight"], P[name + ".bias"], eps=1e-5)

    def linear(x, name):
        return F.linear(x, P[name + ".weight"], P.get(name + ".bias"))

    x = P["embed.wte"][idx]
    if "embed.wpe" in P:
        x = x + P["embed.wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        p = f"block{l}."
        qkv = linear(norm(x, p + "ln1"), p + "qkv")
        q, k, v = qkv.split([A, KVH * hs, KVH * hs], dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k, v = [z.view(B, T, KVH, hs).transpose(1, 2) for z in (k, v)]
        if rope:
            q, k = rotary(q, meta["rope_theta"]), rotary(k, meta["rope_theta"])
        k, v = [z.repeat_interleave(NH // KVH, dim=1) for z in (k, v)]  # each key/value head serves NH/KVH queries
        att = (q @ k.transpose(-2, -1)) / hs ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, A)
        x = x + linear(y, p + "proj")
        h = linear(norm(x, p + "ln2"), p + "fc1")
        if ffn == "gelu":
            h = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.split(I, dim=2)
            h = (F.silu(gate) if ffn == "swiglu" else F.gelu(gate, approximate="tanh")) * up
        x = x + linear(h, p + "fc2")
    x = norm(x, "ln_f")
    logits = x @ P["lm_head.weight" if "lm_head.weight" in P else "embed.wte"].t()  # untied or tied LM head
    loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T).long())
    return logits, loss


def train_reference(meta, params, tokens, targets, steps, dpu_warmup=None, clip=None):
    """AdamW(lr, wd 0) in float32 over `steps` batches from `params`: each step's loss and gradient norm.
    dpu_warmup W: from step W + 1 on, each update applies the gradient of the step before (ZeRO-Offload's
    delayed update: none at step W + 1), computed at parameters one update behind. clip: each applied
    gradient through clip_grad_norm_(clip) first."""
    P = unpack(meta, params, torch.float32)  # what the GPU computes with
    master = {k: v.detach().clone().requires_grad_(True) for k, v in P.items()}  # what the optimizer updates
    opt = torch.optim.AdamW(list(master.values()), lr=meta["lr"], weight_decay=0.0)
    losses, norms, pending = [], [], None
    for s in range(steps):
        for v in P.values():
            v.grad = None
        _, loss = gpt_forward(meta, P, tokens[s], targets[s])
        loss.backward()
        losses.append(loss.item())
        grads = {k: v.grad.detach().clone() for k, v in P.items()}
        norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])).item())
        if dpu_warmup is None or s < dpu_warmup:
            apply = grads
        else:
            apply, pending = pending, grads
        if apply is not None:
            opt.zero_grad()
            for k, v in master.items():
                v.grad = apply[k]
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(list(master.values()), clip)
            opt.step()
        with torch.no_grad():
            for k in P:
                P[k].copy_(master[k])
    return losses, norms


def rel(x, r):
    r = np.asarray(r, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(x, dtype=np.float64) - r)) / max(np.max(np.abs(r)), 1e-30))


def check(name, value, tol):
    ok = value <= tol
    if not ok:
        failures.append(f"{name}: {value:.3g} > {tol:g}")
    return ok


def main():
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ci in CIS:
            d = os.path.join(tmp, f"ci{ci}")
            os.mkdir(d)
            meta, params, grads, logits, tokens, targets = run_tool(ci, d)
            B, T, S = meta["B"], meta["T"], meta["steps"]
            tokens = torch.tensor(tokens.reshape(S, B, T), dtype=torch.long)
            targets = torch.tensor(targets.reshape(S, B, T), dtype=torch.long)
            results[ci] = grads

            # float64 reference for batch 0
            P = unpack(meta, params, torch.float64)
            ref_logits, ref_loss = gpt_forward(meta, P, tokens[0], targets[0])
            ref_loss.backward()
            worst_grad, worst_name = 0.0, ""
            for t in meta["tensors"]:
                g = grads[t["offset"]:t["offset"] + t["elems"]].reshape(t["shape"])
                e = rel(g, P[t["name"]].grad.numpy())
                check(f"ci {ci} grad {t['name']}", e, GRAD_TOL)
                if e > worst_grad:
                    worst_grad, worst_name = e, t["name"]
            e_logits = rel(logits.reshape(B, T, -1), ref_logits.detach().numpy())
            check(f"ci {ci} logits", e_logits, GRAD_TOL)
            e_loss = abs(meta["loss"] - ref_loss.item()) / abs(ref_loss.item())
            check(f"ci {ci} loss", e_loss, LOSS_TOL)

            # 10 AdamW steps in float32
            P32 = unpack(meta, params, torch.float32)
            opt = torch.optim.AdamW(list(P32.values()), lr=meta["lr"], weight_decay=0.0)
            worst_step = 0.0
            ref_losses = []
            for s in range(S):
                opt.zero_grad()
                _, l = gpt_forward(meta, P32, tokens[s], targets[s])
                l.backward()
                opt.step()
                ref_losses.append(l.item())
                e = abs(meta["losses"][s] - l.item()) / abs(l.item())
                check(f"ci {ci} step {s + 1} loss", e, LOSS_TOL)
                worst_step = max(worst_step, e)
            print(f"ci {ci}: loss {meta['loss']:.6f} (torch {ref_loss.item():.6f}, rel {e_loss:.2e}); logits rel "
                  f"{e_logits:.2e}; max grad rel {worst_grad:.2e} ({worst_name}) over {len(meta['tensors'])} tensors; "
                  f"10 Adam steps: losses {meta['losses'][0]:.4f} -> {meta['losses'][-1]:.4f} "
                  f"(torch {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}), max rel {worst_step:.2e}")

    if KIND != "gpt" and MP == 1:
        # the same model under every placement and with tiling 2: the losses of the default run
        with tempfile.TemporaryDirectory() as tmp:
            base = None
            runs = [(STRATEGY, ())] + [(p, ()) for p in PRESETS] + [(STRATEGY, ("--tiling=2",))]
            for n, (strategy, extra) in enumerate(runs):
                d = os.path.join(tmp, f"{n}.{strategy}")
                os.mkdir(d)
                meta = run_tool(1, d, strategy=strategy, extra=extra)[0]
                if base is None:
                    base = meta["losses"]
                    continue
                worst = max(abs(a - b) / abs(b) for a, b in zip(meta["losses"], base))
                print(f"{strategy}{' tiling 2' if extra else ''}: losses {meta['losses'][0]:.6f} -> "
                      f"{meta['losses'][-1]:.6f}, max rel {worst:.2e} against {STRATEGY}")
                check(f"{strategy} {' '.join(extra)} losses", worst, 1e-6)

    for ci in CIS[1:]:
        same = np.array_equal(results[ci], results[0])
        diff = float(np.max(np.abs(results[ci] - results[0])))
        print(f"ci {ci} vs ci 0: gradients {'bit-identical' if same else f'differ (max abs {diff:.3g})'}")
        if not same and (BACKEND == "cpu" and MP == 1 or rel(results[ci], results[0]) > 1e-6):
            failures.append(f"ci {ci}: gradients differ from ci 0 by up to {diff:.3g}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("torch_reference.py: OK")


if __name__ == "__main__":
    main()
