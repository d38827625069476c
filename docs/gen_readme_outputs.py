#!/usr/bin/env python3
"""The README's example outputs, generated: runs every command whose output README.md shows and
rewrites (--write) or checks (--check, the default) the fenced block after each
`<!-- gen: NAME -->` marker.

    docs/gen_readme_outputs.py [--write | --check] [--build DIR] [--readme FILE]

Run from anywhere; commands run in the repository root with ./build/memwall replaced by DIR/memwall
(default build/), with OPENBLAS_CORETYPE=Haswell (see BLAS_ENV). CTest runs --check
(`readme.outputs_match`).

--check also runs every `./build/memwall` line of the README's ```sh blocks (commands shown without
their output) in a scratch folder mirroring the repository, and fails on any that does not exit 0.

What --check normalises, and nothing else: numbers that depend on how fast this machine is at the
moment, all in `memwall run` outputs (blocks run, run_nvme, plan_run, ranks): tokens/s, step ms
and hidden % of the step rows, the iteration and compute times and the hidden % of the "loss"
line, the busy ms, achieved GB/s and exposed ms of the link table, the times, tokens/s, hidden
fraction and threads of `--json`'s step lines, the throughput line and fields (tokens/s, MFU, HFU,
time to train: they follow the step time), validate's measured tokens/s and MFU and its steady
iterations' range, and the host
threads line (threads fitted to the load other programs put on the machine, and that load); with them the spaces that align table
columns (a wider number shifts a column). Losses, bytes, peaks, schedules and every number of
analyze, schedule and simulate must match exactly.
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, build, cwd=ROOT, env_extra=None, expect_rc=0, stream="stdout"):
    """Runs a README command line (a list; './build/memwall' becomes BUILD/memwall)."""
    argv = [os.path.join(build, "memwall") if a == "./build/memwall" else a for a in cmd]
    env = dict(os.environ)
    env.update(BLAS_ENV)
    env.update(env_extra or {})
    p = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=900)
    if p.returncode != expect_rc:
        sys.exit(f"gen_readme_outputs: {' '.join(cmd)}: exit {p.returncode}, expected {expect_rc}\n{p.stderr}")
    return (p.stdout if stream == "stdout" else p.stderr).rstrip("\n").split("\n")


def shown(cmd, continuation=None):
    """The command as the README prints it after '$ '."""
    if continuation is None:
        return "$ " + " ".join(cmd)
    return "$ " + " ".join(cmd[:continuation]) + " \\\n      " + " ".join(cmd[continuation:])


def elide(lines, keep):
    """Keeps lines by index ranges [(a, b), ...] (Python slices, negative from the end); '  ...'
    marks every gap."""
    out, last = [], 0
    n = len(lines)
    for a, b in keep:
        a = a % n if a < 0 else a
        b = n if b is None else (b % n if b < 0 else b)
        if a > last:
            out.append("  ...")
        out.extend(lines[a:b])
        last = b
    if last < n:
        out.append("  ...")
    return out


def index_of(lines, pattern, start=0):
    for i in range(start, len(lines)):
        if re.search(pattern, lines[i]):
            return i
    sys.exit(f"gen_readme_outputs: no line matches /{pattern}/ in:\n" + "\n".join(lines))


# Each block: a function of the build folder returning the block's lines (without the fences).

SCHEDULE = ["./build/memwall", "schedule", "--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "64",
            "--vocab", "512", "--strategy", "zero_inf_nvme", "--dp", "4"]
SIMULATE = ["./build/memwall", "simulate", "--model", "table1-1T", "--bsz", "7", "--place", "act_ckpt=cpu"]
RUN = ["./build/memwall", "run", "--config", "exec/data/run.yaml", "--steps", "100"]
PLAN = ["./build/memwall", "plan", "--profile", "local-cpu", "--layers", "8", "--hidden", "512", "--heads", "8",
        "--seq", "64", "--vocab", "256", "-o", "p.yaml"]
PLAN_RUN = ["./build/memwall", "run", "--plan", "p.yaml", "--steps", "5"]
RANKS = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "./build/memwall", "run", "--config",
         "tests/exec/engine/fixtures/big.yaml", "--strategy", "zero_inf_nvme", "--nvme-dir", "SWAP", "--bsz", "1",
         "--steps", "3"]
# OpenBLAS picks its GEMM kernels for the CPU it runs on, and they round differently (the 100-step
# loss moves in the 4th digit between Cooperlake and Haswell kernels): the README's runs use the
# Haswell kernels, which every x86-64 CPU with AVX2 runs, so they reproduce across machines.
BLAS_ENV = {"OPENBLAS_CORETYPE": "Haswell"}
MPI_ENV = {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def run_table(lines):
    """A run's output: the header and the first step row, '...', the last step row, the summary."""
    header = index_of(lines, r"^ +step +loss")
    last_row = index_of(lines, r"^$", header) - 1
    return elide(lines, [(0, header + 2), (last_row, None)])


def block_analyze(build):
    return run(["./build/memwall", "analyze"], build)


def block_table3(build):
    return run(["./build/memwall", "analyze", "--table", "table3"], build)


def block_schedule(build):
    out = run(SCHEDULE, build)
    summary = index_of(out, r"^rank 0 of dp")
    return [shown(SCHEDULE)] + elide(out, [(0, 20), (summary - 2, None)])


def block_simulate(build):
    return [shown(SIMULATE)] + run(SIMULATE, build)


def block_run(build):
    return [shown(RUN)] + run_table(run(RUN, build))


def block_run_nvme(build):
    with tempfile.TemporaryDirectory(prefix="memwall-readme-") as swap:
        out = run(RUN + ["--strategy", "zero_inf_nvme", "--nvme-dir", swap], build)
    return out[index_of(out, r"^loss "):]


RUN_JSON = ["./build/memwall", "run", "--config", "exec/data/run.yaml", "--steps", "100", "--json"]
RUN_LLAMA = ["./build/memwall", "run", "--config", "exec/data/llama.yaml", "--steps", "100"]


RUN_CLIP = ["./build/memwall", "run", "--config", "exec/data/run.yaml", "--steps", "8", "--strategy", "zero_inf_cpu",
            "--grad-clip", "1"]


def block_run_clip(build):
    """Gradient clipping: the step table with each step's global norm (* where it was clipped)."""
    out = run(RUN_CLIP, build)
    header = index_of(out, r"^ +step +loss")
    return [shown(RUN_CLIP)] + out[header:index_of(out, r"^$", header)]


def block_run_llama(build):
    return [shown(RUN_LLAMA)] + run_table(run(RUN_LLAMA, build))


def block_run_json(build):
    out = run(RUN_JSON, build)
    return [shown(RUN_JSON) + " | head -3"] + out[:3]


def block_calibrated(build):
    """The start of the calibrated profile results/validation/run.py wrote (the file itself: a fresh
    calibration measures this machine's speed today, which the check cannot hold still)."""
    path = os.path.join(ROOT, "results", "validation", "calibrated.yaml")
    lines = open(path).read().rstrip("\n").split("\n")
    return ["$ head -24 results/validation/calibrated.yaml"] + lines[:24] + ["  ..."]


VALIDATE = ["./build/memwall", "validate", "--profile", "results/validation/calibrated.yaml", "--config",
            "results/validation/small.yaml", "--strategy", "zero_inf_nvme", "--nvme-dir", "/tmp", "--steps", "12",
            "--top", "5"]


def block_validate(build):
    out = run(VALIDATE, build)
    differ = index_of(out, r"^steps whose start times differ most")
    # which steps differ most changes from run to run: the block shows the table and that header
    return [shown(VALIDATE, 7)] + out[:differ + 2] + ["  ..."]


def block_plan_run(build):
    with tempfile.TemporaryDirectory(prefix="memwall-readme-") as d:
        plan = run(PLAN, build, cwd=d)
        chosen = index_of(plan, r"^chosen:")
        check = index_of(plan, r"^schedule check")
        out = [shown(PLAN)] + plan[chosen:chosen + 1] + ["..."] + plan[check:check + 1]
        out += [shown(PLAN_RUN)] + run_table(run(PLAN_RUN, build, cwd=d))
    return out


PLAN_GLOBAL = ["./build/memwall", "plan", "--model", "table1-10B", "--global-batch", "512", "--runners", "3"]
PLAN_3D = ["./build/memwall", "plan", "--model", "table1-10B", "--fix", "strategy=three_d", "--global-batch", "512"]


def block_plan_batch(build):
    """A plan with a fixed global batch (the split into bsz, accumulation and dp, the runners-up's
    dp and accum columns) and the 3D-parallel one with pipeline stages; the search's milliseconds
    are left out (they depend on the machine)."""
    plan = run(PLAN_GLOBAL, build)
    chosen, runners, check = index_of(plan, r"^chosen:"), index_of(plan, r"^runners-up:"), index_of(plan, r"^schedule check")
    out = [shown(PLAN_GLOBAL)] + plan[chosen:chosen + 5] + ["..."] + plan[runners:runners + 5] + plan[check:check + 1]
    three_d = run(PLAN_3D, build)
    chosen, check = index_of(three_d, r"^chosen:"), index_of(three_d, r"^schedule check")
    return out + [shown(PLAN_3D)] + three_d[chosen:chosen + 5] + ["..."] + three_d[check:check + 1]


MODELS_TODAY = ["./build/memwall", "models"]
PLAN_LLAMA = ["./build/memwall", "plan", "--profile", "dgx-h100", "--model", "llama3-70B", "--seq", "4096",
              "--global-batch", "64", "--tokens", "1B"]
PLAN_LLAMA_WS = ["./build/memwall", "plan", "--profile", "workstation", "--model", "llama3-70B", "--seq", "4096",
                 "--global-batch", "64", "--tokens", "1B"]
PLAN_MIXTRAL = ["./build/memwall", "plan", "--profile", "dgx-h100", "--model", "mixtral-8x7B", "--global-batch", "256",
                "--tokens", "1B"]


def block_models_today(build):
    """The catalogue's models published after the paper, beside their published counts."""
    out = run(MODELS_TODAY, build)
    first = index_of(out, r"^gpt2-124M")
    return [shown(MODELS_TODAY)] + out[:1] + ["..."] + out[first:]


def block_plan_llama(build):
    """A Llama-3 70B fine-tune on one DGX-H100 node and on a workstation, and Mixtral 8x7B: the plan
    and its explanation (the search's milliseconds left out)."""
    out = []
    for cmd in (PLAN_LLAMA, PLAN_LLAMA_WS, PLAN_MIXTRAL):
        plan = run(cmd, build)
        end = index_of(plan, r"^runners-up:")
        out += [shown(cmd)] + plan[:end]
    return out


def block_ranks(build):
    with tempfile.TemporaryDirectory(prefix="memwall-readme-") as swap:
        out = run([swap if a == "SWAP" else a for a in RANKS], build, env_extra=MPI_ENV)
    links = index_of(out, r"^  link ")
    per_rank = index_of(out, r"^per rank")
    end = index_of(out, r"^device memory used")
    cmd = [("/tmp/swap" if a == "SWAP" else a) for a in RANKS]
    return [shown(cmd, 9)] + elide(out, [(links, links + 4), (per_rank, per_rank + 5), (end, None)])


def block_bad_profile(build):
    with tempfile.TemporaryDirectory(prefix="memwall-readme-") as d:
        shutil.copy(os.path.join(ROOT, "tests/cli/fixtures/no_unit.yaml"), os.path.join(d, "broken.yaml"))
        cmd = ["./build/memwall", "analyze", "--profile", "broken.yaml", "--model", "fig2a-1T"]
        return [shown(cmd)] + run(cmd, build, cwd=d, expect_rc=2, stream="stderr")


BLOCKS = {
    "analyze": block_analyze,
    "table3": block_table3,
    "schedule": block_schedule,
    "simulate": block_simulate,
    "run": block_run,
    "run_nvme": block_run_nvme,
    "run_json": block_run_json,
    "run_llama": block_run_llama,
    "run_clip": block_run_clip,
"validate": block_validate,
    "calibrated": block_calibrated,
    "plan_run": block_plan_run,
    "plan_batch": block_plan_batch,
    "ranks": block_ranks,
    "models_today": block_models_today,
    "plan_llama": block_plan_llama,
    "bad_profile": block_bad_profile,
}
TIMED = {"run", "run_nvme", "run_json", "run_llama", "run_clip", "plan_run", "ranks", "validate"}
# validate's rows: the measured column and the error vary with the machine's speed; simulated is exact
VALIDATE_ROW = re.compile(r"^(\s+\S.*?)\s+[0-9.]+ ms\s+([0-9.]+ ms)\s+[+-][0-9.]+ %$")
JSON_TIME = re.compile(r'"(iteration_s|tokens_per_s|compute_s|hidden_fraction|threads|tokens_per_s_per_gpu|'
                       r'model_tflops_per_gpu|hardware_tflops_per_gpu|mfu|hfu|train_s)":[-0-9.e+]+')
# validate's tokens/s and MFU rows: measured and error vary; simulated is exact
# validate's statistic line: the steady iterations' range and spread
VALIDATE_SPREAD = re.compile(r"\(they ran [0-9.]+-[0-9.]+ ms, [0-9.]+ % apart\)")
VALIDATE_RATE = re.compile(r"^(\s+(?:tokens/s|MFU))\s+[0-9.]+(?: [KMBTQ%])?\s+([0-9.]+(?: [KMBTQ%])?)\s+[+-][0-9.]+ %$")
# run's throughput line (results/METRICS.md): the rates and the time to train follow the step time
THROUGHPUT_LINE = re.compile(r"[0-9.]+(?: [KMBTQ])? tokens/s \([0-9.]+(?: [KMBTQ])? per GPU\), MFU [0-9.]+ %, "
                             r"HFU [0-9.]+ % of (.*?); (.*?) in (?:[0-9.]+ \S+|never)$")

STEP_ROW = re.compile(r"^(\s+\d+\s+[0-9.]+)\s+\d+\s+[0-9.]+\s+(-|\d+ %)(.*)$")
LOSS_LINE = re.compile(r"iteration [0-9.]+ ms, compute [0-9.]+ ms, ([0-9.]+ % of transfer)?")
THREADS_LINE = re.compile(r"^(\s+host threads) \d+ \(fitted: .*\)$")
LINK_ROW = re.compile(r"^(\s+(?:\d+\s+)?[a-z_]+\s+[0-9.]+ ?[KMGT]?i?B\s+[0-9.]+ ?[KMGT]?i?B)\s+[0-9.]+ ms\s+(?:[0-9.]+ GB/s|-)\s+[0-9.]+ ms$")


def normalise(name, lines):
    if name not in TIMED:
        return lines
    out = []
    for line in lines:
        line = STEP_ROW.sub(r"\1 <tokens/s> <ms> <hidden>\3", line)
        line = LOSS_LINE.sub(lambda m: "iteration <ms>, compute <ms>, " +
                             ("<hidden> % of transfer" if m.group(1) else ""), line)
        line = LINK_ROW.sub(r"\1 <busy> <achieved> <exposed>", line)
        line = THREADS_LINE.sub(r"\1 <n> (fitted: <the load>)", line)
        line = JSON_TIME.sub(r'"\1":<measured>', line)
        line = THROUGHPUT_LINE.sub(r"<tokens/s> tokens/s (<per GPU>), MFU <%>, HFU <%> of \1; \2 in <time>", line)
        if name == "validate":
            line = VALIDATE_RATE.sub(r"\1 <measured> \2 <error>", line)
            line = VALIDATE_SPREAD.sub("(they ran <fastest>-<slowest> ms, <spread> % apart)", line)
            line = VALIDATE_ROW.sub(r"\1 <measured> \2 <error>", line)
        out.append(re.sub(r" +", " ", line))
    return out


MARKER = re.compile(r"^<!-- gen: ([a-z_0-9]+) -->$")


def blocks_in(text):
    """(name, first line index of the block's body, index of its closing fence) per marker."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            sys.exit(f"gen_readme_outputs: line {i + 1}: marker {m.group(1)} not followed by a fenced block")
        end = i + 2
        while end < len(lines) and lines[end] != "```":
            end += 1
        found.append((m.group(1), i + 2, end))
    return lines, found


def sh_block_commands(text):
    """The ./build/memwall lines of the README's ```sh blocks (commands shown without output)."""
    cmds, in_sh = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            in_sh = line.strip() == "```sh" and not in_sh
            continue
        if in_sh and line.startswith("./build/memwall "):
            cmds.append(line.split("  #")[0].split(" # ")[0].strip())
    return cmds


def check_sh_commands(text, build):
    """Runs every command of the README's ```sh blocks (in a scratch folder that mirrors the
    repository, so their output files land there) and fails on any that does not exit 0."""
    failed = []
    with tempfile.TemporaryDirectory(prefix="memwall-readme-sh-") as d:
        for entry in os.listdir(ROOT):
            if entry != "build":
                os.symlink(os.path.join(ROOT, entry), os.path.join(d, entry))
        os.symlink(build, os.path.join(d, "build"))
        for cmd in sh_block_commands(text):
            p = subprocess.run(cmd, shell=True, cwd=d, env={**os.environ, **BLAS_ENV}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, timeout=900)
            print(f"sh: {cmd}: exit {p.returncode}")
            if p.returncode != 0:
                failed.append(f"{cmd}: exit {p.returncode}: {p.stderr.strip()}")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the README's generated blocks")
    ap.add_argument("--check", action="store_true", help="compare (default)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--only", help="comma-separated block names")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    with open(a.readme) as f:
        text = f.read()
    lines, found = blocks_in(text)
    names = [n for n, _, _ in found]
    missing = set(BLOCKS) - set(names)
    unknown = set(names) - set(BLOCKS)
    if missing or unknown:
        sys.exit(f"gen_readme_outputs: README markers missing: {sorted(missing)}, unknown: {sorted(unknown)}")
    only = set(a.only.split(",")) if a.only else None
    failed = []
    for name, body, end in reversed(found):  # from the end, so indices stay valid while rewriting
        if only and name not in only:
            continue
        want = "\n".join(BLOCKS[name](build)).split("\n")  # a shown command may span lines
        have = lines[body:end]
        if a.write:
            lines[body:end] = want
            print(f"{name}: {len(want)} lines written")
            continue
        nw, nh = normalise(name, want), normalise(name, have)
        if nw == nh:
            print(f"{name}: ok ({len(have)} lines{', timings normalised' if name in TIMED else ''})")
        else:
            failed.append(name)
            print(f"{name}: README.md differs from the command's output (README -, generated +):")
            sys.stdout.writelines(l + "\n" for l in difflib.unified_diff(nh, nw, lineterm="", n=1))
    if a.write:
        with open(a.readme, "w") as f:
            f.write("\n".join(lines))
        return 0
    if not only:
        for f in check_sh_commands(text, build):
            failed.append("sh")
            print("gen_readme_outputs: a command of a sh block fails: " + f)
    if failed:
        print(f"gen_readme_outputs: {len(failed)} block(s) out of date: {', '.join(reversed(failed))}; "
              "regenerate with docs/gen_readme_outputs.py --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
