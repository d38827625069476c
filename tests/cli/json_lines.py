"""json_lines.py STEPS -- COMMAND...: runs a memwall command with --json and checks its JSON Lines.

Every line is one JSON object; the first STEPS are "type": "step" with steps 1..STEPS in order, each
with its loss, lr, iteration_s, tokens_per_s, compute_s and hidden_fraction; the last is the
"type": "summary". The first step's line must arrive while the command still runs (streamed as the
step completes, not printed at the end): the command is read through a pipe, line by line.
"""
import json
import subprocess
import sys

steps = int(sys.argv[1])
cmd = sys.argv[sys.argv.index("--") + 1:]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
first = p.stdout.readline()
running_at_first_line = p.poll() is None
rest = p.stdout.read()
rc = p.wait()
if rc != 0:
    sys.exit(f"exit code {rc}")
lines = [first] + rest.splitlines()
objs = [json.loads(line) for line in lines if line.strip()]
if len(objs) != steps + 1:
    sys.exit(f"expected {steps} step lines and a summary, got {len(objs)} lines")
for i, o in enumerate(objs[:-1], start=1):
    if o.get("type") != "step" or o.get("step") != i:
        sys.exit(f"line {i}: expected type step, step {i}, got {o.get('type')} {o.get('step')}")
    for k in ("loss", "lr", "iteration_s", "tokens_per_s", "compute_s", "hidden_fraction"):
        if k not in o:
            sys.exit(f"line {i}: no {k}")
summary = objs[-1]
if summary.get("type") != "summary":
    sys.exit(f"last line: expected type summary, got {summary.get('type')}")
if isinstance(summary.get("steps"), list) and [s["loss"] for s in summary["steps"]] != [o["loss"] for o in objs[:-1]]:
    sys.exit("the summary's losses differ from the step lines'")
if not running_at_first_line:
    sys.exit("the first step's line came only after the command ended (not streamed)")
print(f"json lines ok: {steps} steps streamed, then the summary ({len(summary)} keys)")
