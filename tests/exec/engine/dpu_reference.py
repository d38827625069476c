"""dpu_reference.py GPT_REF_TOOL: ZeRO-Offload's delayed parameter update as the engine runs it
(zero_offload, fp32, --optimizer-overlap dpu after 3 warm-up steps, 12 steps) against the same
update order written out in PyTorch, and --optimizer-overlap backward against none (bit for bit).

The order (G_i: the gradient of step i's batch at the parameters the GPU holds in step i):
  steps 1..W (warm-up)  as usual: params <- AdamW(params, G_i)
  step W+1              no pending gradient: G_{W+1} is computed, nothing is applied
  step i > W+1          G_i at the GPU's parameters, which lack the update with G_{i-1}; the CPU
                        applies G_{i-1} meanwhile; the GPU gets the result after step i
so every delayed step computes its gradient one update behind. Losses agree within 1e-4 relative
(torch's float32 kernels against memwall's), and differ from the ordinary run's after step W+1.
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as tr  # noqa: E402

TOOL = sys.argv[1]
W, S = 3, 12
fail = []
with tempfile.TemporaryDirectory() as tmp:
    runs = {}
    for mode in ("none", "backward", "dpu"):
        d = os.path.join(tmp, mode)
        os.mkdir(d)
        runs[mode] = tr.run_tool(1, d, tool=TOOL, backend="cpu", strategy="zero_offload",
                                 extra=(mode, str(W), str(S)))
    meta, params = runs["dpu"][0], runs["dpu"][1]
    B, T = meta["B"], meta["T"]
    tokens = torch.tensor(runs["dpu"][4].reshape(S, B, T), dtype=torch.long)
    targets = torch.tensor(runs["dpu"][5].reshape(S, B, T), dtype=torch.long)
    if runs["backward"][0]["losses"] != runs["none"][0]["losses"]:
        fail.append("backward overlap changed the losses")
    ref = tr.train_reference(meta, params, tokens, targets, S, dpu_warmup=W)[0]
    got = meta["losses"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    if worst > 1e-4:
        fail.append(f"dpu losses differ from the reference by {worst:.2e}: {got} vs {ref}")
    plain = runs["none"][0]["losses"]
    if max(abs(a - b) for a, b in zip(got[W + 1:], plain[W + 1:])) < 1e-6:
        fail.append("dpu gave the ordinary run's losses: nothing was delayed")
    print(f"dpu after {W} steps: losses {got[0]:.4f} -> {got[-1]:.4f}, reference {ref[0]:.4f} -> {ref[-1]:.4f}, "
          f"worst relative difference {worst:.1e}; ordinary run ends at {plain[-1]:.4f}; "
          f"backward overlap bit-identical to none")
if fail:
    print("FAILED:\n  " + "\n  ".join(fail))
    sys.exit(1)
print("dpu_reference.py: OK")
