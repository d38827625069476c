"""clip_reference.py GPT_REF_TOOL [BACKEND]: gradient-norm clipping (`--grad-clip`, TrainingConfig::grad_clip)
as the engine runs it, against torch.nn.utils.clip_grad_norm_ before each AdamW step.

The tiny GPT of torch_reference.py (fp32, 10 steps) with a largest norm of 1.45: its gradient norms
here run from 1.1 to 46 (a loss spike at step 8), so some steps are scaled and some are not (the
script checks that both happen). The engine takes the norm where each placement keeps its gradients:
  data_parallel, zero2, zero3   on the device (sum_squares over each unit's optimizer slice)
  zero_offload, zero_inf_cpu,   in CPU memory (on the host lane)
  three_d, l2l
  zero_inf_nvme                 summed from the pinned copy as each final gradient is written to NVMe
and the updates wait for it. Checked, per preset:
  every step's global norm (before clipping) against torch's    rel <= 1e-4
  every step's loss against torch's (float32, as torch_reference.py)   rel <= 1e-4
and that a largest norm above every step's trains bit for bit as no clipping (the coefficient is
exactly 1), and that dpu (zero_offload, 3 warm-up steps) applies each delayed gradient scaled by its
own norm, as the delayed order written in torch (dpu_reference.py's) with clip_grad_norm_ on the
gradient it applies.
Run with /usr/bin/python3 (Debian's python3-torch). Second argument: the backend (cpu, the default,
or cuda; exit 77 = skipped, no device).
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as tr  # noqa: E402

TOOL = sys.argv[1]
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "cpu"
CLIP = 1.45
TOL = 1e-4
W, S_DPU = 3, 12
fail = []


def batches(meta, tokens, targets, steps):
    B, T = meta["B"], meta["T"]
    return (torch.tensor(tokens.reshape(steps, B, T), dtype=torch.long),
            torch.tensor(targets.reshape(steps, B, T), dtype=torch.long))


def worst(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


with tempfile.TemporaryDirectory() as tmp:
    ref = None
    for strategy in tr.PRESETS:
        d = os.path.join(tmp, strategy)
        os.mkdir(d)
        meta, params, _, _, tokens, targets = tr.run_tool(1, d, tool=TOOL, backend=BACKEND, strategy=strategy,
                                                          extra=(f"--clip={CLIP}",))
        if ref is None:
            tk, tg = batches(meta, tokens, targets, meta["steps"])
            ref = tr.train_reference(meta, params, tk, tg, meta["steps"], clip=CLIP)
            clipped = sum(n > CLIP for n in ref[1])
            if not 0 < clipped < len(ref[1]):
                fail.append(f"the reference norms {ref[1]} leave no contrast at {CLIP}: {clipped} steps clipped")
        e_loss, e_norm = worst(meta["losses"], ref[0]), worst(meta["grad_norms"], ref[1])
        print(f"{strategy}: norms {meta['grad_norms'][0]:.4f} .. max {max(meta['grad_norms']):.3f}, losses "
              f"{meta['losses'][0]:.4f} -> {meta['losses'][-1]:.4f}; against torch: norm rel {e_norm:.1e}, loss rel {e_loss:.1e}")
        if e_norm > TOL:
            fail.append(f"{strategy}: norms {meta['grad_norms']} against torch's {ref[1]} (rel {e_norm:.2e})")
        if e_loss > TOL:
            fail.append(f"{strategy}: losses {meta['losses']} against torch's {ref[0]} (rel {e_loss:.2e})")
    print(f"torch: {sum(n > CLIP for n in ref[1])} of {len(ref[1])} steps clipped at {CLIP}")

    # a largest norm above every norm: the coefficient is exactly 1, the run is the unclipped one
    runs = {}
    for name, extra in (("off", ()), ("above", ("--clip=1000",))):
        d = os.path.join(tmp, "nvme-" + name)
        os.mkdir(d)
        runs[name] = tr.run_tool(1, d, tool=TOOL, backend=BACKEND, strategy="zero_inf_nvme", extra=extra)[0]
    if runs["off"]["losses"] != runs["above"]["losses"]:
        fail.append(f"clipping at 1000 changed the losses: {runs['above']['losses']} vs {runs['off']['losses']}")
    else:
        print("zero_inf_nvme clipped at 1000: the unclipped losses, bit for bit")

    # dpu: each delayed update applies the gradients of the step before, scaled by their own norm
    d = os.path.join(tmp, "dpu")
    os.mkdir(d)
    meta, params, _, _, tokens, targets = tr.run_tool(1, d, tool=TOOL, backend=BACKEND, strategy="zero_offload",
                                                      extra=("dpu", str(W), str(S_DPU), f"--clip={CLIP}"))
    tk, tg = batches(meta, tokens, targets, S_DPU)
    losses, norms = tr.train_reference(meta, params, tk, tg, S_DPU, dpu_warmup=W, clip=CLIP)
    e_loss, e_norm = worst(meta["losses"], losses), worst(meta["grad_norms"], norms)
    print(f"dpu after {W} steps: losses {meta['losses'][0]:.4f} -> {meta['losses'][-1]:.4f}, against torch: norm rel "
          f"{e_norm:.1e}, loss rel {e_loss:.1e}")
    if e_norm > TOL or e_loss > TOL:
        fail.append(f"dpu: norms rel {e_norm:.2e}, losses rel {e_loss:.2e}: {meta['losses']} vs {losses}")

if fail:
    print("FAILED:\n  " + "\n  ".join(fail))
    sys.exit(1)
print("clip_reference.py: OK")
