#!/usr/bin/env python3
"""make_corpus.py: writes memwall's bad-input corpus (issue 16) into tests/corpus/.

  files/*.yaml   bad profiles, models, placements, plans and run configs, each a good base file with
                 one thing wrong (or a structural defect: duplicate keys, alias bombs, ...)
  cases.tsv      one case per line: name, status, the regex its one stderr line must match, the
                 memwall arguments (shell words; {files} is tests/corpus/files, {tmp} the case's own
                 empty working folder, which run_corpus.py also seeds with a symlink loop, a FIFO and
                 a folder named like a YAML file)

Every case must exit 2 with exactly one stderr line that names the file (and line and field) or
the flag, print nothing on stdout and leave no file behind (run_corpus.py checks all four). A
status other than "ok" names whose file still has to change ("pending:exec/engine/run_config.cpp");
such a case must still not crash, and run_corpus.py says when it starts passing.

  python3 make_corpus.py           rewrite files/ and cases.tsv
  python3 make_corpus.py --check   exit 1 if what is committed differs from what this script writes
"""
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

cases = []   # (name, status, regex, args)
files = {}   # name -> text


def esc(s):
    return re.escape(s)


def case(name, args, regex, status="ok"):
    assert "\t" not in regex and "\n" not in regex, name
    assert not any(c[0] == name for c in cases), "duplicate case " + name
    cases.append((name, status, regex, args))


def file_case(fname, text, cmd, args, fragment, status="ok", where=None):
    """A case whose bad input is the file `fname` (written with `text`): the message must name the
    file, then `fragment` (already a regex)."""
    files[fname] = text
    a = args.replace("@", "{files}/" + fname)
    case(os.path.splitext(fname)[0], a, "^memwall " + cmd + ": .*" + esc(fname) + (where or "") + fragment, status)


def line_of(text, needle):
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise KeyError(needle)


def set_line(text, needle, new_line):
    out = []
    done = False
    for line in text.splitlines(True):
        if not done and needle in line:
            out.append(new_line + "\n")
            done = True
        else:
            out.append(line)
    assert done, needle
    return "".join(out)


def value_of(line):
    return line.split(":", 1)[1].strip()


# ------------------------------------------------------------------------------------------------
# Profiles
PROFILE = """name: corpus
description: the base every bad profile of the corpus edits
nodes: 1
gpu:
  count_per_node: 2
  memory: 16 GiB
  peak: 10 TFLOPS
links:
  gpu_gpu: 50 GB/s
  pcie_single_gpu: 10 GB/s
  pcie_aggregate: 16 GB/s
  inter_node: 100 Gbps
cpu:
  memory: 64 GB
  memory_bandwidth: 40 GB/s
  adam_throughput: 1 G params/s
  pinned_budget: 8 GiB
nvme:
  capacity: 1 TB
  read: 3 GB/s
  write: 2 GB/s
"""

# Each profile is exercised by one command; the commands rotate so every subcommand that takes a
# profile reads bad ones.
PROFILE_COMMANDS = [
    ("analyze", "analyze --profile @ --model fig2a-1T"),
    ("schedule", "schedule --profile @ --layers 2 --hidden 1K --heads 8"),
    ("simulate", "simulate --profile @ --layers 2 --hidden 1K --heads 8"),
    ("plan", "plan --profile @ --model table1-10B"),
    ("plan", "plan --check {src}/tests/corpus/good_plan.yaml --profile @"),
    ("reproduce", "reproduce --profile @ --figure fig5c -o {tmp}/out"),
    ("run", "run --profile @ --config {src}/tests/exec/engine/fixtures/short.yaml --steps 1"),
]
_rot = [0]


def profile_case(fname, text, fragment, where=None):
    cmd, args = PROFILE_COMMANDS[_rot[0] % len(PROFILE_COMMANDS)]
    _rot[0] += 1
    file_case(fname, text, cmd, args, fragment, where=where)


QUANTITIES = [  # (section.key, needle, a unit, the largest unit, the base unit)
    ("gpu.memory", "  memory: 16 GiB", "GiB", "PiB", "B"),
    ("gpu.peak", "  peak: 10 TFLOPS", "TFLOPS", "PFLOPS", "FLOPS"),
    ("links.gpu_gpu", "  gpu_gpu:", "GB/s", "TB/s", "B/s"),
    ("links.pcie_single_gpu", "  pcie_single_gpu:", "GB/s", "TB/s", "B/s"),
    ("links.pcie_aggregate", "  pcie_aggregate:", "GB/s", "TB/s", "B/s"),
    ("links.inter_node", "  inter_node:", "Gbps", "Tbps", "B/s"),
    ("cpu.memory", "  memory: 64 GB", "GB", "PB", "B"),
    ("cpu.memory_bandwidth", "  memory_bandwidth:", "GB/s", "TB/s", "B/s"),
    ("cpu.adam_throughput", "  adam_throughput:", "G params/s", "P params/s", "params/s"),
    ("cpu.pinned_budget", "  pinned_budget:", "GiB", "PiB", "B"),
    ("nvme.capacity", "  capacity:", "TB", "PB", "B"),
    ("nvme.read", "  read:", "GB/s", "TB/s", "B/s"),
    ("nvme.write", "  write:", "GB/s", "TB/s", "B/s"),
]
BAD_QUANTITIES = [  # (tag, value from (unit, big unit, base unit), message regex)
    ("nounit", lambda u, b, one: "16", r"expected .*\(a unit is required\)"),
    ("badunit", lambda u, b, one: "16 parsecs", r'expected .*\(unknown unit "parsecs"\)'),
    ("zero", lambda u, b, one: "0 " + u, r"expected a positive value"),
    ("negative", lambda u, b, one: "-5 " + u, r"expected a positive value"),
    ("inf", lambda u, b, one: "inf " + u, r"expected a finite number"),
    ("nan", lambda u, b, one: "nan " + u, r"expected a finite number"),
    ("overflow", lambda u, b, one: "1e308 " + b, r"expected a finite number"),
    ("huge", lambda u, b, one: "1e300 " + one, r"expected at most"),
    ("tiny", lambda u, b, one: "1e-300 " + u, r"expected at least"),
    ("list", lambda u, b, one: "[16, " + u + "]", r"expected a"),
    ("text", lambda u, b, one: "fast", r"expected a"),
]
for i, (field, needle, unit, big, one) in enumerate(QUANTITIES):
    key = field.split(".")[1]
    for j in range(4):  # four bad values per field, rotating through the classes
        tag, make, msg = BAD_QUANTITIES[(i * 4 + j) % len(BAD_QUANTITIES)]
        line = line_of(PROFILE, needle)
        text = set_line(PROFILE, needle, "  " + key + ": " + make(unit, big, one))
        profile_case("profile_%s_%s.yaml" % (field.replace(".", "_"), tag), text, esc(field) + ": " + msg,
                     where=":%d: " % line)

for key, needle, hi in [("nodes", "nodes: 1", 65536), ("gpu.count_per_node", "count_per_node", 1024)]:
    short = key.split(".")[-1]
    indent = "  " if "." in key else ""
    for tag, v in [("zero", "0"), ("negative", "-1"), ("int32", "2147483648"), ("int32u", "4294967296"),
                   ("exponent", "1e9"), ("fraction", "2.5"), ("word", "two"), ("hex", "0x10"), ("huge", "99999999999999999999999")]:
        text = set_line(PROFILE, needle, indent + short + ": " + v)
        profile_case("profile_%s_%s.yaml" % (short, tag), text,
                     esc(key) + ": expected an integer from 1 to %d, got \"%s\"" % (hi, esc(v)),
                     where=":%d: " % line_of(PROFILE, needle))

structural = [
    ("profile_list.yaml", "- a\n- list\n", r":1: expected a YAML mapping at the top level"),
    ("profile_empty.yaml", "", r":1: expected a YAML mapping at the top level"),
    ("profile_comment_only.yaml", "# nothing here\n", r":1: expected a YAML mapping at the top level"),
    ("profile_scalar.yaml", "just words\n", r":1: expected a YAML mapping at the top level"),
    ("profile_unclosed.yaml", PROFILE.replace("  memory: 16 GiB", "  memory: [16 GiB"), r":[0-9]+: malformed YAML"),
    ("profile_tab.yaml", PROFILE.replace("  peak: 10 TFLOPS", "\tpeak: 10 TFLOPS"), r":[0-9]+: malformed YAML"),
    ("profile_map_in_value.yaml", PROFILE.replace("name: corpus", "name: corpus: again"), r":[0-9]+: malformed YAML"),
    ("profile_duplicate_top.yaml", PROFILE + "nodes: 2\n", r":22: nodes: given twice \(first at line 3\)"),
    ("profile_duplicate_nested.yaml", PROFILE.replace("  peak: 10 TFLOPS", "  peak: 10 TFLOPS\n  peak: 20 TFLOPS"),
     r":8: gpu.peak: given twice \(first at line 7\)"),
    ("profile_duplicate_quoted.yaml", PROFILE + "\"name\": again\n", r":22: name: given twice \(first at line 1\)"),
    ("profile_map_key.yaml", PROFILE + "? {a: 1}\n: 3\n", r":22: key: expected a field name"),
    ("profile_list_key.yaml", PROFILE.replace("gpu:\n", "gpu:\n  ? [count]\n  : 2\n"), r":5: gpu: expected a field name"),
    ("profile_unknown_top.yaml", PROFILE + "colour: blue\n", r":22: colour: unknown field"),
    ("profile_unknown_nested.yaml", PROFILE + "  iops: 1M\n", r":22: nvme.iops: unknown field"),
    ("profile_no_gpu.yaml", re.sub(r"gpu:\n(  .*\n)+", "", PROFILE, count=1), r":[0-9]+: gpu: missing field \(expected a mapping\)"),
    ("profile_gpu_scalar.yaml", re.sub(r"gpu:\n(  .*\n)+", "gpu: 5\n", PROFILE, count=1), r":4: gpu: expected a mapping"),
    ("profile_no_name.yaml", PROFILE.replace("name: corpus\n", ""), r":1: name: missing field"),
    ("profile_name_list.yaml", PROFILE.replace("name: corpus", "name: [a, b]"), r":1: name: expected a string"),
    ("profile_missing_peak.yaml", PROFILE.replace("  peak: 10 TFLOPS\n", ""), r":[0-9]+: gpu.peak: missing field \(expected a compute rate"),
    ("profile_pcie_below_single.yaml", PROFILE.replace("pcie_aggregate: 16 GB/s", "pcie_aggregate: 5 GB/s"),
     r":11: links.pcie_aggregate: expected at least links.pcie_single_gpu"),
    ("profile_pinned_above_memory.yaml", PROFILE.replace("pinned_budget: 8 GiB", "pinned_budget: 80 GiB"),
     r":17: cpu.pinned_budget: expected at most cpu.memory"),
    ("profile_two_nodes_no_network.yaml", PROFILE.replace("nodes: 1", "nodes: 2").replace("  inter_node: 100 Gbps\n", ""),
     r":[0-9]+: links.inter_node: missing field \(expected a bandwidth"),
    ("profile_peak_table_scalar.yaml", PROFILE.replace("  peak: 10 TFLOPS", "  peak: 10 TFLOPS\n  peak_by_hidden: 5"),
     r":8: gpu.peak_by_hidden: expected a list"),
    ("profile_peak_table_order.yaml", PROFILE.replace("  peak: 10 TFLOPS", "  peak: 10 TFLOPS\n  peak_by_hidden:\n"
                                                      "    - {hidden: 8K, peak: 10 TFLOPS}\n    - {hidden: 4K, peak: 12 TFLOPS}"),
     r":10: gpu.peak_by_hidden\[1\].hidden: expected hidden sizes in ascending order"),
    ("profile_peak_table_hidden.yaml", PROFILE.replace("  peak: 10 TFLOPS", "  peak: 10 TFLOPS\n  peak_by_hidden:\n"
                                                       "    - {hidden: 4M, peak: 10 TFLOPS}"),
     r":9: gpu.peak_by_hidden\[0\].hidden: expected a positive hidden size"),
    ("profile_executor_backend.yaml", PROFILE + "executor: {backend: tpu}\n", r":22: executor.backend: expected cpu or cuda, got \"tpu\""),
    ("profile_executor_precision.yaml", PROFILE + "executor: {backend: cpu, precision: fp8}\n",
     r":22: executor.precision: expected bf16, fp16 or fp32, got \"fp8\""),
    ("profile_executor_list.yaml", PROFILE + "executor: [cpu]\n", r":22: executor: expected a mapping"),
    ("profile_deep.yaml", PROFILE.replace("description: the base every bad profile of the corpus edits",
                                          "description: " + "[" * 40 + "]" * 40), r":2: description(\[0\])+: nested deeper than 32 levels"),
    ("profile_alias_bomb.yaml", "name: corpus\n" + "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        "a%d: &a%d [%s]\n" % (k, k, ", ".join(["*a%d" % (k - 1)] * 10)) for k in range(1, 7)),
     r":[0-9]+: [a-z0-9.\[\]]*: more than 100000 YAML nodes \(aliases\?\)"),
    ("profile_nul.yaml", PROFILE.replace("name: corpus", "name: cor\x00pus"), r""),
    # two profiles joined into one file: the second was dropped without a word (YAML::Load reads one)
    ("profile_two_documents.yaml", PROFILE + "---\n" + PROFILE.replace("name: corpus", "name: second"),
     r":%d: a second document after the first \(after `---`, or text after JSON's closing brace\); expected one document per file" % (len(PROFILE.splitlines()) + 2)),
]
for fname, text, frag in structural:
    profile_case(fname, text, frag)
# A profile whose pinned budget cuts a large model's optimizer into billions of chunks.
files["profile_tiny_pinned.yaml"] = PROFILE.replace("pinned_budget: 8 GiB", "pinned_budget: 1 KiB")
case("profile_tiny_pinned_schedule", "schedule --profile {files}/profile_tiny_pinned.yaml --model fig2a-100T",
     "^memwall schedule: .*profile_tiny_pinned.yaml: cpu.pinned_budget: 1.00 KiB per node cuts the optimizer")
case("profile_tiny_pinned_simulate", "simulate --profile {files}/profile_tiny_pinned.yaml --model table1-1T",
     "^memwall simulate: .*profile_tiny_pinned.yaml: cpu.pinned_budget: 1.00 KiB per node cuts the optimizer")

# Paths that are not readable profile files: every way a path can be wrong, once per file type.
PATH_CASES = [
    ("missing", "{tmp}/nope.yaml", r"nope.yaml: no such %s file"),
    ("folder", "{tmp}/folder.yaml", r"folder.yaml: is a folder, not a %s file"),
    ("loop", "{tmp}/loop_a.yaml", r"loop_a.yaml: cannot read the %s file: too many levels of symbolic links"),
    ("fifo", "{tmp}/fifo.yaml", r"fifo.yaml: not a regular file"),
    ("dev_zero", "/dev/zero", r"/dev/zero: not a regular file"),
    ("proc_mem", "/proc/self/mem", r"/proc/self/mem: cannot read the %s file: Input/output error"),
    ("under_file", "{src}/README.md/x.yaml", r"x.yaml: no such %s file \(a part of the path is not a folder\)"),
    ("big", "{tmp}/big.yaml", r"big.yaml: 1.00 MiB, larger than any %s file \(at most 1.00 MiB\)"),
]
YAML_PATHS = [c for c in PATH_CASES if c[1].endswith(".yaml")]  # models and placements are files when named .yaml
for tag, path, frag in PATH_CASES:
    if tag == "missing":
        frag = r"nope.yaml: no such profile file, and not a built-in profile"
    elif tag == "under_file":
        frag = r"x.yaml: no such profile file, and not a built-in profile"
    case("path_profile_" + tag, "analyze --model fig2a-1T --profile " + path, "^memwall analyze: .*" + frag.replace("%s", "profile"))
for tag, path, frag in YAML_PATHS:
    case("path_model_" + tag, "schedule --model " + path, "^memwall schedule: .*" + frag.replace("%s", "model"))
for tag, path, frag in PATH_CASES:
    if tag != "big":
        case("path_plan_" + tag, "plan --check " + path, "^memwall plan: .*" + frag.replace("%s", "plan"))
for tag, path, frag in YAML_PATHS:
    case("path_placement_" + tag, "simulate --layers 2 --hidden 1K --heads 8 --strategy " + path,
         "^memwall simulate: .*" + frag.replace("%s", "placement"))
case("path_profile_empty_name", "analyze --model fig2a-1T --profile ''", r"^memwall analyze: --profile: expected a value, got an empty string$")
# a line break in a path is written as \n (one_line), never split over two lines
case("path_profile_newline", "analyze --model fig2a-1T --profile 'two\\nlines.yaml'", r"^memwall analyze: two\\nlines.yaml: no such profile file")

# ------------------------------------------------------------------------------------------------
# Models
MODEL = """name: corpus-model
layers: 4
hidden: 1024
heads: 16
seq: 512
vocab: 50257
"""
MODEL_COMMANDS = [
    ("analyze", "analyze --model @"),
    ("schedule", "schedule --model @"),
    ("simulate", "simulate --model @"),
    ("plan", "plan --model @"),
]
_mrot = [0]


def model_case(fname, text, fragment, where=None):
    cmd, args = MODEL_COMMANDS[_mrot[0] % len(MODEL_COMMANDS)]
    _mrot[0] += 1
    file_case(fname, text, cmd, args, fragment, where=where)


for key, hi, values in [
    ("layers", 100000, ["0", "-1", "100001", "4294967296", "2.5", "four", "1e3"]),
    ("heads", 65536, ["0", "4294967296", "4294967300", "65537", "-16"]),
    ("seq", 16777216, ["0", "16777217", "1e3", "-512"]),
    ("vocab", 16777216, ["0", "-1", "4294967296", "50K"]),
]:
    for v in values:
        tag = re.sub(r"[^a-z0-9]", "_", v.lower())
        text = set_line(MODEL, key + ":", key + ": " + v)
        model_case("model_%s_%s.yaml" % (key, tag), text,
                   esc(key) + ": expected an integer from 1 to %d, got \"%s\"" % (hi, esc(v)),
                   where=":%d: " % line_of(MODEL, key + ":"))
for v in ["0", "-4", "4M", "2048K", "1.5K", "abc", "99999999999K", "[1024]"]:
    tag = re.sub(r"[^a-z0-9]", "_", v.lower())
    text = set_line(MODEL, "hidden:", "hidden: " + v)
    model_case("model_hidden_%s.yaml" % tag, text, r"hidden: expected a (positive )?hidden size", where=":3: ")
model_structural = [
    ("model_heads_not_divisor.yaml", MODEL.replace("heads: 16", "heads: 24"), r":4: heads: expected a divisor of hidden 1024"),
    ("model_no_layers.yaml", MODEL.replace("layers: 4\n", ""), r":1: layers: missing field"),
    ("model_no_hidden.yaml", MODEL.replace("hidden: 1024\n", ""), r":1: hidden: missing field"),
    ("model_no_heads.yaml", MODEL.replace("heads: 16\n", ""), r":1: heads: missing field"),
    ("model_unknown.yaml", MODEL + "dropout: 0.1\n", r":7: dropout: unknown field"),
    ("model_duplicate.yaml", MODEL + "layers: 8\n", r":7: layers: given twice \(first at line 2\)"),
    ("model_note_map.yaml", MODEL + "note: {a: b}\n", r":7: note: expected a string"),
    ("model_name_list.yaml", MODEL.replace("name: corpus-model", "name: [x]"), r":1: name: expected a string"),
    ("model_list.yaml", "- layers: 4\n", r":1: expected a YAML mapping"),
    ("model_malformed.yaml", MODEL.replace("heads: 16", "heads: {16"), r":[0-9]+: malformed YAML"),
    ("model_map_key.yaml", MODEL + "? [layers]\n: 4\n", r":7: key: expected a field name"),
    ("model_layers_too_many_for_memory.yaml", MODEL.replace("layers: 4", "layers: 100000"),
     r": --layers: 100000 makes a schedule of about"),
    # today's kinds (issue 27)
    ("model_ffn_relu.yaml", MODEL + "ffn: relu\n", r":7: ffn: expected one of gelu, swiglu, geglu, got \"relu\""),
    ("model_kv_heads_not_divisor.yaml", MODEL + "kv_heads: 3\n", r":7: kv_heads: expected a divisor of heads 16"),
    ("model_kv_heads_too_many.yaml", MODEL + "kv_heads: 32\n", r":7: kv_heads: expected an integer from 1 to 16"),
    ("model_norm_batch.yaml", MODEL + "norm: batchnorm\n", r":7: norm: expected one of layernorm, rmsnorm"),
    ("model_tied_maybe.yaml", MODEL + "tied_embeddings: maybe\n", r":7: tied_embeddings: expected true or false"),
    ("model_window_zero.yaml", MODEL + "attention_window: 0\n", r":7: attention_window: expected an integer from 1 to 16777216"),
    ("model_moe_list.yaml", MODEL + "moe: [4]\n", r":7: moe: expected a mapping"),
    ("model_moe_topk.yaml", MODEL + "moe: {experts: 4, experts_per_token: 5, expert_intermediate: 256}\n",
     r":7: moe.experts_per_token: expected an integer from 1 to 4"),
    ("model_moe_unknown.yaml", MODEL + "moe: {experts: 4, experts_per_token: 2, expert_intermediate: 256, capacity: 1}\n",
     r":7: moe.capacity: unknown field"),
    ("model_moe_no_size.yaml", MODEL + "moe: {experts: 4, experts_per_token: 2}\n", r":7: moe.expert_intermediate: missing field"),
]
for fname, text, frag in model_structural:
    if fname == "model_layers_too_many_for_memory.yaml":
        files[fname] = text
        case("model_layers_too_many_for_memory", "schedule --model {files}/" + fname,
             "^memwall schedule: --layers: 100000 makes a schedule of about .*memory a schedule may take \\(at most [0-9]+ here\\)")
        continue
    model_case(fname, text, frag)

# ------------------------------------------------------------------------------------------------
# Hugging Face config.json (--model-config, or --model with a .json path): one thing wrong each
with open(os.path.join(HERE, "..", "model", "hf_configs", "llama3-8b.json")) as f:
    HF = f.read()
HF_COMMANDS = [
    ("analyze", "analyze --model-config @"),
    ("plan", "plan --model @"),
    ("simulate", "simulate --model-config @"),
]
_hrot = [0]


def hf_case(fname, text, fragment):
    cmd, args = HF_COMMANDS[_hrot[0] % len(HF_COMMANDS)]
    _hrot[0] += 1
    file_case(fname, text, cmd, args, fragment)


for fname, old, new, frag in [
    ("hf_model_type.json", '"model_type": "llama"', '"model_type": "mamba"', r":12: model_type: memwall reads the causal LMs"),
    ("hf_unknown_field.json", '"use_cache": true', '"num_local_experts": 8', r":23: num_local_experts: unknown field"),
    ("hf_kv_not_divisor.json", '"num_key_value_heads": 8', '"num_key_value_heads": 5',
     r":15: num_key_value_heads: expected a divisor of num_attention_heads 32"),
    ("hf_act_relu.json", '"hidden_act": "silu"', '"hidden_act": "relu"', r":7: hidden_act: expected silu"),
    ("hf_mlp_bias.json", '"attention_bias": false', '"mlp_bias": true', r":3: mlp_bias: biases in the MLP"),
    ("hf_head_dim.json", '"use_cache": true', '"head_dim": 0', r":23: head_dim: expected an integer from 1 to"),
    ("hf_hidden_text.json", '"hidden_size": 4096', '"hidden_size": "big"', r":8: hidden_size: expected an integer"),
    ("hf_no_layers.json", '"num_hidden_layers": 32,', '', r":1: num_hidden_layers: missing field"),
    ("hf_truncated.json", HF, HF[:200], r":[0-9]+: malformed JSON"),
    ("hf_list.json", HF, "[1, 2]", r":1: expected a YAML mapping"),
    # text after the closing brace was read as a second YAML document and dropped
    ("hf_trailing_text.json", HF, HF.rstrip("\n") + " garbage\n", r":%d: a second document after the first" % (HF.rstrip("\n").count("\n") + 1)),
]:
    hf_case(fname, HF.replace(old, new) if old != HF else new, frag)

# ------------------------------------------------------------------------------------------------
# Placements
PLACEMENT = """preset: zero3
optim32: {tier: cpu, partitioned: true}
"""
PLACEMENT_COMMANDS = [
    ("schedule", "schedule --layers 2 --hidden 1K --heads 8 --strategy @"),
    ("simulate", "simulate --layers 2 --hidden 1K --heads 8 --strategy @"),
    ("run", "run --config {src}/tests/exec/engine/fixtures/short.yaml --steps 1 --strategy @"),
]
_prot = [0]


def placement_case(fname, text, fragment):
    cmd, args = PLACEMENT_COMMANDS[_prot[0] % len(PLACEMENT_COMMANDS)]
    _prot[0] += 1
    file_case(fname, text, cmd, args, fragment)


for fname, text, frag in [
    ("placement_unknown_preset.yaml", "preset: zero9\n", r":1: preset: --strategy: unknown strategy \"zero9\""),
    ("placement_preset_list.yaml", "preset: [zero3]\n", r":1: preset: expected a string"),
    ("placement_tier_disk.yaml", PLACEMENT.replace("tier: cpu", "tier: disk"), r":2: optim32.tier: expected a tier \(gpu, cpu or nvme\), got \"disk\""),
    ("placement_tier_missing.yaml", PLACEMENT.replace("tier: cpu, ", ""), r":2: optim32.tier: missing field"),
    ("placement_partitioned_yes.yaml", PLACEMENT.replace("partitioned: true", "partitioned: yes"), r":2: optim32.partitioned: expected true or false, got \"yes\""),
    ("placement_partitioned_one.yaml", PLACEMENT.replace("partitioned: true", "partitioned: 1"), r":2: optim32.partitioned: expected true or false, got \"1\""),
    ("placement_partitioned_list.yaml", PLACEMENT.replace("partitioned: true", "partitioned: [true]"), r":2: optim32.partitioned: expected true or false"),
    ("placement_ckpt_nvme.yaml", "preset: zero3\nact_ckpt: {tier: nvme}\n", r": placement zero3\+custom: act_ckpt on nvme is not supported"),
    ("placement_ckpt_partitioned.yaml", "preset: zero3\nact_ckpt: {tier: cpu, partitioned: true}\n", r": act_ckpt.partitioned: partitioned checkpoints are split across the tensor-slicing ranks .*with --mp 1 there is nothing to split"),
    ("placement_grad_nvme_whole_params.yaml", "preset: zero2\noptim32: {tier: nvme, partitioned: true}\ngrad16: {tier: nvme, partitioned: true}\n",
     r": placement zero2\+custom: grad16 on nvme with param16 unpartitioned"),
    ("placement_grad_not_optim.yaml", "preset: zero3\ngrad16: {tier: cpu, partitioned: true}\noptim32: {tier: nvme, partitioned: true}\n",
     r": placement zero3\+custom: grad16 on cpu but optim32 on nvme"),
    ("placement_state_scalar.yaml", "preset: zero3\nparam16: cpu\n", r":2: param16: expected \{tier: gpu\|cpu\|nvme, partitioned: true\|false\}"),
    ("placement_unknown_state.yaml", "preset: zero3\nparam32: {tier: cpu}\n", r":2: param32: unknown field"),
    ("placement_unknown_inner.yaml", "preset: zero3\nparam16: {tier: cpu, pinned: true}\n", r":2: param16.pinned: unknown field"),
    ("placement_bad_fetch.yaml", "preset: zero3\nfetch: scatter\n", r":2: fetch: expected allgather or broadcast, got \"scatter\""),
    ("placement_no_preset_missing.yaml", "param16: {tier: gpu}\n", r":1: grad16: missing field \(no preset to take it from\)"),
    ("placement_map_key.yaml", "preset: zero3\n? {a: 1}\n: 3\n", r":2: key: expected a field name"),
    ("placement_duplicate.yaml", "preset: zero3\noptim32: {tier: cpu, partitioned: true}\noptim32: {tier: nvme, partitioned: true}\n",
     r":3: optim32: given twice \(first at line 2\)"),
    ("placement_unpartitioned_offload.yaml", "preset: zero3\noptim32: {tier: cpu, partitioned: false}\n",
     r": placement zero3\+custom: grad16 partitioned but optim32 not"),
    ("placement_empty.yaml", "", r":1: expected a YAML mapping"),
]:
    placement_case(fname, text, frag)

# ------------------------------------------------------------------------------------------------
# Plans (the base is what `memwall plan --layers 4 --hidden 1K --heads 16 -o` writes, in
# tests/corpus/good_plan.yaml)
with open(os.path.join(HERE, "good_plan.yaml")) as f:
    PLAN = f.read()
PLAN_COMMANDS = [
    ("plan", "plan --check @"),
    ("simulate", "simulate --plan @"),
    ("run", "run --plan @ --steps 1"),
]
_plrot = [0]


def plan_case(fname, text, fragment, commands=None):
    cmds = commands or PLAN_COMMANDS
    cmd, args = cmds[_plrot[0] % len(cmds)]
    _plrot[0] += 1
    file_case(fname, text, cmd, args, fragment)


def plan_field(needle, new, frag, fname, commands=None):
    plan_case(fname, set_line(PLAN, needle, new), ":%d: " % line_of(PLAN, needle) + frag, commands)


CHECK_ONLY = [("plan", "plan --check @"), ("simulate", "simulate --plan @")]
# gradient clipping: a bad norm, and the overlap that updates before the norm exists
_ov = line_of(PLAN, "  prefetch_depth:") + 1
plan_case("plan_grad_clip_negative.yaml", set_line(PLAN, "  prefetch_depth:", "  prefetch_depth: 3\n  grad_clip: -1"),
          ":%d: training.grad_clip: expected a number > 0" % _ov)
plan_case("plan_grad_clip_backward.yaml",
          set_line(PLAN, "  prefetch_depth:", "  prefetch_depth: 3\n  optimizer_overlap: backward\n  grad_clip: 1"),
          ":%d: training.optimizer_overlap: --optimizer-overlap backward: not with --grad-clip" % _ov)
plan_field("version:", "version: 2", r"version: expected an integer from 1 to 1, got \"2\"", "plan_version_2.yaml")
plan_field("version:", "version: one", r"version: expected an integer from 1 to 1, got \"one\"", "plan_version_word.yaml")
plan_field("nodes:", "nodes: 0", r"nodes: expected an integer from 1 to 65536, got \"0\"", "plan_nodes_zero.yaml")
plan_field("nodes:", "nodes: 4294967296", r"nodes: expected an integer from 1 to 65536, got \"4294967296\"", "plan_nodes_2pow32.yaml")
plan_field("gpus:", "gpus: 0", r"gpus: expected an integer from 1 to 67108864, got \"0\"", "plan_gpus_zero.yaml")
plan_field("gpus:", "gpus: 8", r"gpus: expected training.dp x training.mp = 16 x 1 = 16, got 8", "plan_gpus_mismatch.yaml")
plan_field("objective:", "objective: fastest", r"objective: expected throughput or max-model, got \"fastest\"", "plan_objective.yaml")
plan_field("  layers:", "  layers: 0", r"model.layers: expected an integer from 1 to 100000, got \"0\"", "plan_layers_zero.yaml")
plan_field("  layers:", "  layers: 4294967297", r"model.layers: expected an integer from 1 to 100000", "plan_layers_2pow32.yaml")
plan_field("  hidden:", "  hidden: 4M", r"model.hidden: expected a positive hidden size", "plan_hidden_4M.yaml")
plan_field("  heads:", "  heads: 24", r"model.heads: expected a divisor of hidden 1024", "plan_heads_not_divisor.yaml")
plan_field("  heads:", "  heads: 4294967312", r"model.heads: expected an integer from 1 to 65536", "plan_heads_2pow32.yaml")
plan_field("  seq:", "  seq: 0", r"model.seq: expected an integer from 1 to 16777216, got \"0\"", "plan_seq_zero.yaml")
plan_field("  vocab:", "  vocab: -1", r"model.vocab: expected an integer from 1 to 16777216, got \"-1\"", "plan_vocab_negative.yaml")
plan_field("  param16:", "  param16: {tier: disk, partitioned: false}", r"placement.param16.tier: expected a tier", "plan_tier_disk.yaml")
plan_field("  param16:", "  param16: {tier: gpu, partitioned: maybe}", r"placement.param16.partitioned: expected true or false, got \"maybe\"", "plan_partitioned_maybe.yaml")
plan_case("plan_ckpt_nvme.yaml", set_line(PLAN, "  act_ckpt:", "  act_ckpt: {tier: nvme, partitioned: false}"),
          r":%d: placement: placement zero2: act_ckpt on nvme is not supported" % (PLAN.splitlines().index("placement:") + 2))  # a block mapping's line is its first key's
plan_field("  fetch:", "  fetch: scatter", r"placement.fetch: expected allgather or broadcast, got \"scatter\"", "plan_fetch.yaml")
for tag, v, frag in [("zero", "0", r"expected a number > 0 and at most 65536, got \"0\""),
                     ("negative", "-1", r"expected a number > 0 and at most 65536, got \"-1\""),
                     ("inf", "inf", r"expected a number > 0 and at most 65536, got \"inf\""),
                     ("nan", "nan", r"expected a number > 0 and at most 65536, got \"nan\""),
                     ("huge", "1e308", r"expected a number > 0 and at most 65536, got \"1e308\""),
                     ("word", "two", r"expected a number > 0 and at most 65536, got \"two\"")]:
    plan_field("  bsz:", "  bsz: " + v, "training.bsz: " + frag, "plan_bsz_%s.yaml" % tag)
plan_field("  ci:", "  ci: 0", r"training.ci: expected an integer from 1 to 4, got \"0\"", "plan_ci_zero.yaml")
plan_field("  ci:", "  ci: 5", r"training.ci: expected an integer from 1 to 4, got \"5\"", "plan_ci_above_layers.yaml")
plan_field("  tiling_factor:", "  tiling_factor: 1000000", r"training.tiling_factor: expected an integer from 1 to 4096, got \"1000000\"", "plan_tiling_1e6.yaml")
plan_field("  tiling_factor:", "  tiling_factor: 1e6", r"training.tiling_factor: expected an integer from 1 to 4096, got \"1e6\"", "plan_tiling_1e6_float.yaml")
plan_field("  tiling_factor:", "  tiling_factor: 0", r"training.tiling_factor: expected an integer from 1 to 4096, got \"0\"", "plan_tiling_zero.yaml")
plan_field("  dp:", "  dp: 0", r"training.dp: expected an integer from 1 to 67108864, got \"0\"", "plan_dp_zero.yaml")
plan_field("  dp:", "  dp: 4294967312", r"training.dp: expected an integer from 1 to 67108864", "plan_dp_2pow32.yaml")
plan_field("  mp:", "  mp: 0", r"training.mp: expected an integer from 1 to 1024, got \"0\"", "plan_mp_zero.yaml")
plan_field("  prefetch_depth:", "  prefetch_depth: -1", r"training.prefetch_depth: expected an integer from 0 to 64, got \"-1\"", "plan_prefetch_negative.yaml")
plan_field("  prefetch_depth:", "  prefetch_depth: 1000000", r"training.prefetch_depth: expected an integer from 0 to 64, got \"1000000\"", "plan_prefetch_1e6.yaml")
plan_field("  prefetch_depth:", "  prefetch_depth: 40", r"training.prefetch_depth: expected at most 25 for 4 layer\(s\)", "plan_prefetch_past_pass.yaml")
plan_field("  iteration_s:", "  iteration_s: -1", r"predicted.iteration_s: expected a number from 0 to 1e18, got \"-1\"", "plan_predicted_negative.yaml")
plan_field("  tflops_per_gpu:", "  tflops_per_gpu: [1]", r"predicted.tflops_per_gpu: expected a number from 0 to 1e18", "plan_predicted_list.yaml")
plan_field("profile:", "profile: [dgx2]", r"profile: expected a string", "plan_profile_list.yaml")
plan_case("plan_unknown_field.yaml", PLAN + "comment: hi\n", ":%d: comment: unknown field" % (len(PLAN.splitlines()) + 1))
plan_case("plan_duplicate.yaml", PLAN.replace("  dp: 16", "  dp: 16\n  dp: 8"), r":%d: training.dp: given twice" % (line_of(PLAN, "  dp:") + 1))
plan_case("plan_no_training.yaml", re.sub(r"training:\n(  .*\n)+", "", PLAN), r":[0-9]+: training: missing field")
plan_case("plan_no_profile.yaml", PLAN.replace("profile: dgx2\n", ""), r":[0-9]+: profile: missing field")
plan_case("plan_list.yaml", "- version: 1\n", r":1: expected a YAML mapping")
# Cross-checks against the profile the plan runs on (plan --check and simulate --plan).
big = set_line(set_line(PLAN, "gpus:", "gpus: 32              # dp x mp"), "  dp:", "  dp: 32")
plan_case("plan_more_gpus_than_profile.yaml", big, r":%d: gpus: plan names 32 GPUs, profile dgx2 has 16" % line_of(PLAN, "gpus:"),
          CHECK_ONLY)
sliced = set_line(set_line(set_line(PLAN, "gpus:", "gpus: 15"), "  dp:", "  dp: 5"), "  mp:", "  mp: 3")
plan_case("plan_mp_not_divisor.yaml", sliced, r":%d: training.mp: expected a divisor of the node's 16 GPUs" % line_of(PLAN, "  mp:"),
          CHECK_ONLY)
files["plan_two_nodes.yaml"] = set_line(PLAN, "nodes:", "nodes: 2")
case("plan_two_nodes_check", "plan --check {files}/plan_two_nodes.yaml",
     r"^memwall plan: .*plan_two_nodes.yaml:4: nodes: plan names 2 node\(s\), profile dgx2 has 1 \(scale it with --nodes 2\)")
files["plan_unknown_profile.yaml"] = set_line(PLAN, "profile:", "profile: dgx9")
case("plan_unknown_profile_simulate", "simulate --plan {files}/plan_unknown_profile.yaml",
     r"^memwall simulate: dgx9: no such profile file, and not a built-in profile")
case("plan_unknown_profile_run", "run --plan {files}/plan_unknown_profile.yaml --steps 1",
     r"^memwall run: dgx9: no such profile file, and not a built-in profile")

# ------------------------------------------------------------------------------------------------
# Run configs (`memwall run --config`): exec/engine/run_config.cpp parses them.
RUN = """layers: 2
hidden: 32
heads: 4
steps: 2
bsz: 2
seq: 16
lr: 3e-3
"""


def run_case(fname, text, frag, status="ok", extra=""):
    file_case(fname, text, "run", "run --config @" + extra, frag, status)


def run_field(key, value, frag, tag, status="ok"):
    if key + ":" in RUN:
        text = set_line(RUN, key + ":", key + ": " + value)
        where = ":%d: " % line_of(RUN, key + ":")
    else:
        text = RUN + key + ": " + value + "\n"
        where = ":%d: " % (len(RUN.splitlines()) + 1)
    run_case("run_%s_%s.yaml" % (key, tag), text, where + key + ": " + frag, status)


run_field("layers", "0", r"expected an integer from 1 to 1000, got \"0\"", "zero")
run_field("layers", "4294967296", r"expected an integer from 1 to 1000", "2pow32")
run_field("hidden", "0", r"expected an integer from 1 to 65536", "zero")
run_field("hidden", "30", r"expected a multiple of heads \(4\), got 30", "not_multiple")
run_field("heads", "0", r"expected an integer from 1 to 1024", "zero")
run_field("steps", "0", r"expected an integer from 1 to", "zero")
run_field("steps", "-1", r"expected an integer from 1 to", "negative")
run_field("steps", "1e9", r"expected an integer from 1 to", "exponent")
run_field("bsz", "0", r"expected an integer from 1 to", "zero")
run_field("seq", "0", r"expected an integer from 1 to", "zero")
run_field("ci", "-1", r"expected an integer from 0 to 2", "negative")
run_field("ci", "3", r"expected an integer from 0 to 2, got \"3\"", "above_layers")
run_field("lr", "0", r"expected a number > 0", "zero")
run_field("lr", "-1", r"expected a number > 0", "negative")
run_field("lr", "inf", r"expected a number > 0", "inf")
run_field("lr", "nan", r"expected a number > 0", "nan")
run_field("lr", "1e308", r"expected a number > 0 and at most 10", "huge")
run_field("weight_decay", "-1", r"expected a number >= 0", "negative")
run_field("weight_decay", "nan", r"expected a number >= 0", "nan")
run_field("grad_clip", "-1", r"expected a number >= 0 and at most 1000000000", "negative")
run_field("grad_clip", "nan", r"expected a number >= 0", "nan")
run_field("seed", "-1", r"expected an integer from 0 to", "negative")
run_field("seed", "abc", r"expected an integer from 0 to", "word")
run_field("backend", "tpu", r"expected cpu or cuda, got \"tpu\"", "tpu")
run_field("compute", "fp8", r"", "fp8")
run_field("precision", "fp8", r"expected bf16, fp16 or fp32, got \"fp8\"", "fp8")
run_field("capacity", "0 B", r"expected a whole number of bytes from 1.00 MiB to 1.00 PiB", "zero")
run_field("capacity", "0.5 B", r"expected a whole number of bytes from 1.00 MiB to 1.00 PiB", "half_byte")
run_field("capacity", "1e30 GiB", r"expected a whole number of bytes from 1.00 MiB to 1.00 PiB", "huge")
run_field("capacity", "nan GiB", r"expected a finite number", "nan")
run_field("capacity", "lots", r"expected a size with a unit", "word")
run_field("corpus", "/proc/self/mem", r"/proc/self/mem: cannot read the corpus file", "proc_mem")
run_field("corpus", "/dev/zero", r"", "dev_zero")
run_field("corpus", "/", r"", "folder")
run_field("corpus", "nope.txt", r".*/nope.txt: no such corpus file", "missing")
# the block's kind (model YAML's fields) and what the executor does not train of it
run_field("kv_heads", "3", r"expected a divisor of heads 4", "not_divisor")
run_field("kv_heads", "8", r"expected an integer from 1 to 4", "above_heads")
run_field("ffn", "relu", r"expected one of gelu, swiglu, geglu, got \"relu\"", "relu")
run_field("intermediate", "0", r"expected an integer from 1 to", "zero")
run_field("norm", "batchnorm", r"expected one of layernorm, rmsnorm", "batchnorm")
run_field("positions", "alibi", r"expected one of learned, rotary", "alibi")
run_field("bias", "some", r"expected one of all, none, qkv, attention", "some")
run_field("tied_embeddings", "maybe", r"", "maybe")
run_field("rope_theta", "0", r"expected a number > 0", "zero")
run_field("rope_theta", "nan", r"expected a number > 0", "nan")
run_field("attention_window", "8", r"the executor's attention is causal over the whole sequence; a window of 8 keys",
          "sliding")
run_case("run_moe.yaml", RUN + "moe: {experts: 4, experts_per_token: 2, expert_intermediate: 64}\n",
         r":8: moe: the executor has no router or expert dispatch")
run_case("run_rope_odd_head.yaml", set_line(RUN, "hidden:", "hidden: 36") + "positions: rotary\n",
         r":8: positions: rotary positions turn channel pairs, so the head size must be even, got 9")
run_case("run_unknown.yaml", RUN + "dropout: 0.1\n", r":8: dropout: unknown field")
run_case("run_duplicate.yaml", RUN + "lr: 1e-3\n", r":8: lr: given twice \(first at line 7\)")
run_case("run_map_key.yaml", RUN + "? {a: 1}\n: 2\n", r":8: key: expected a field name")
run_case("run_list.yaml", "- layers: 2\n", r":1: expected a YAML mapping")
run_case("run_malformed.yaml", RUN.replace("heads: 4", "heads: [4"), r":[0-9]+: malformed YAML")
for tag, path, frag in PATH_CASES[:6]:  # through exec/engine/run_config.cpp's own reading
    case("path_run_config_" + tag, "run --config " + path, "^memwall run: .*" + frag.replace("%s", "run config"))

# ------------------------------------------------------------------------------------------------
# Flags, command by command.
def flag_case(name, cmd, args, frag, status="ok"):
    case("flag_" + name, cmd + " " + args, "^memwall " + cmd + ": " + frag, status)


INT = lambda flag, lo, hi, v: esc(flag) + r": expected an integer from %d to %d, got \"%s\"" % (lo, hi, esc(v))
NUM = lambda flag, hi, v: esc(flag) + r": expected a number > 0 and at most %s, got \"%s\"" % (hi, esc(v))
HELP = lambda cmd: r" \(see memwall %s --help\)$" % cmd

M1T = "--model fig2a-1T"
for v in ["0", "-1", "4294967296", "abc", "65537", "2.5"]:
    flag_case("analyze_nodes_" + re.sub(r"\W", "_", v), "analyze", M1T + " --nodes " + v, INT("--nodes", 1, 65536, v) + HELP("analyze"))
for v in ["0", "-3", "1e9"]:
    flag_case("analyze_gpus_" + re.sub(r"\W", "_", v), "analyze", M1T + " --gpus " + v, INT("--gpus", 1, 67108864, v) + HELP("analyze"))
flag_case("analyze_gpus_17", "analyze", M1T + " --gpus 17", r"--gpus: profile dgx2 has 16 GPUs \(1 node\(s\) x 16\), asked for 17; add nodes with --nodes$")
for v in ["0", "-1", "nan", "inf", "1e308", "abc", "65537", "-inf"]:
    flag_case("analyze_bsz_" + re.sub(r"\W", "_", v), "analyze", M1T + " --bsz=" + v, NUM("--bsz", "65536", v) + HELP("analyze"))
flag_case("analyze_ci_zero", "analyze", M1T + " --ci 0", INT("--ci", 1, 100000, "0") + HELP("analyze"))
flag_case("analyze_ci_above_layers", "analyze", "--model fig2a-0.1T --ci 81", r"--ci: expected a checkpoint interval between 1 and the model's 80 layers, got 81$")
flag_case("analyze_layers_zero", "analyze", "--layers 0 --hidden 1K --heads 8", INT("--layers", 1, 100000, "0") + HELP("analyze"))
flag_case("analyze_layers_huge", "analyze", "--layers 10000000 --hidden 1K --heads 8", INT("--layers", 1, 100000, "10000000") + HELP("analyze"))
flag_case("analyze_hidden_zero", "analyze", "--layers 2 --hidden 0 --heads 8", r"--hidden: expected a positive hidden size")
flag_case("analyze_hidden_4M", "analyze", "--layers 2 --hidden 4M --heads 8", r"--hidden: expected a positive hidden size")
flag_case("analyze_hidden_word", "analyze", "--layers 2 --hidden big --heads 8", r"--hidden: expected a positive hidden size")
flag_case("analyze_heads_zero", "analyze", "--layers 2 --hidden 1K --heads 0", INT("--heads", 1, 65536, "0") + HELP("analyze"))
flag_case("analyze_heads_not_divisor", "analyze", "--layers 2 --hidden 1K --heads 3", r"--heads: expected a divisor of hidden 1024, got 3$")
flag_case("analyze_heads_2pow32", "analyze", "--layers 2 --hidden 1K --heads 4294967296", INT("--heads", 1, 65536, "4294967296") + HELP("analyze"))
flag_case("analyze_seq_zero", "analyze", M1T + " --seq 0", INT("--seq", 1, 16777216, "0") + HELP("analyze"))
flag_case("analyze_seq_negative", "analyze", M1T + " --seq=-5", INT("--seq", 1, 16777216, "-5") + HELP("analyze"))
flag_case("analyze_vocab_zero", "analyze", "--layers 2 --hidden 1K --heads 8 --vocab 0", INT("--vocab", 1, 16777216, "0") + HELP("analyze"))
flag_case("analyze_vocab_negative", "analyze", "--layers 2 --hidden 1K --heads 8 --vocab -1", INT("--vocab", 1, 16777216, "-1") + HELP("analyze"))
flag_case("analyze_missing_hidden", "analyze", "--layers 2 --heads 8", r"--hidden: missing")
flag_case("analyze_missing_heads", "analyze", "--layers 2 --hidden 1K", r"--heads: missing")
flag_case("analyze_model_and_shape", "analyze", M1T + " --layers 3", r"--model: give either --model or --layers")
flag_case("analyze_unknown_model", "analyze", "--model fig2a-7T", r"--model: unknown model \"fig2a-7T\"")
flag_case("analyze_peak_inf", "analyze", "--sweep fig3a --peak 'inf TFLOPS'", r"--peak: expected a finite number, got \"inf TFLOPS\"$")
flag_case("analyze_peak_nounit", "analyze", "--sweep fig3a --peak 70", r"--peak: expected a compute rate .*unit is required")
flag_case("analyze_peak_bandwidth", "analyze", "--sweep fig3a --peak '70 GB/s'", r"--peak: expected a compute rate .*unknown unit")
flag_case("analyze_peak_zero", "analyze", "--sweep fig3a --peak '0 TFLOPS'", r"--peak: expected at least 1.00 FLOPS")
flag_case("analyze_table", "analyze", "--table fig9", r"--table: .*fig9")
flag_case("analyze_sweep", "analyze", "--sweep fig4", r"--sweep: .*fig4")
flag_case("analyze_table_and_sweep", "analyze", "--table fig2a --sweep fig3a", r"--table and --sweep: give one, not both$")
flag_case("analyze_output_folder", "analyze", "-o {tmp}", r".*: is a folder, expected a file name to write$")
flag_case("analyze_output_missing_folder", "analyze", "-o {tmp}/no/such/out.txt", r".*/no/such/out.txt: its folder .*/no/such does not exist \(make it first\)$")
flag_case("analyze_unknown_flag", "analyze", "--frobnicate", r"--frobnicate: not a flag of memwall analyze" + HELP("analyze"))
flag_case("analyze_misspelled_flag", "analyze", "--modle fig2a-1T", r"--modle: not a flag of memwall analyze \(did you mean --model\?\)" + HELP("analyze"))
flag_case("analyze_nodes_twice", "analyze", M1T + " --nodes 2 --nodes 3", r"--nodes" )
flag_case("analyze_cannot_scale", "analyze", "--profile {src}/tests/cli/fixtures/one_node_only.yaml " + M1T + " --nodes 2",
          r".*one_node_only.yaml: links.inter_node: missing field \(needed to scale the profile to 2 nodes\)$")

TINY = "--layers 2 --hidden 256 --heads 4 --seq 64 --vocab 512"
for v in ["-1", "16"]:
    frag = INT("--rank", 0, 67108863, v) + HELP("schedule") if v == "-1" else r"--rank: expected 0..15, got 16$"
    flag_case("schedule_rank_" + re.sub(r"\W", "_", v), "schedule", TINY + " --rank " + v, frag)
flag_case("schedule_dp_zero", "schedule", TINY + " --dp 0", INT("--dp", 1, 67108864, "0") + HELP("schedule"))
flag_case("schedule_dp_17", "schedule", TINY + " --dp 17", r"--dp/--mp: 17 x 1 GPUs asked, profile dgx2 has 16; add nodes with --nodes$")
flag_case("schedule_dp_2pow32", "schedule", TINY + " --dp 4294967296", INT("--dp", 1, 67108864, "4294967296") + HELP("schedule"))
flag_case("schedule_mp_zero", "schedule", TINY + " --mp 0", INT("--mp", 1, 1024, "0") + HELP("schedule"))
flag_case("schedule_mp_3", "schedule", "--model table1-1T --mp 3", r"--mp: tensor slicing stays inside a node of 16 GPUs: expected a divisor of 16, got 3$")
flag_case("schedule_mp_32", "schedule", TINY + " --mp 32", r"--mp: tensor slicing stays inside a node of 16 GPUs: expected a divisor of 16, got 32$")
flag_case("schedule_tiling_zero", "schedule", TINY + " --tiling 0", INT("--tiling", 1, 4096, "0") + HELP("schedule"))
flag_case("schedule_tiling_1e6", "schedule", TINY + " --tiling 1000000", INT("--tiling", 1, 4096, "1000000") + HELP("schedule"))
flag_case("schedule_tiling_memory", "schedule", "--model table1-20T --tiling 4096", r"--tiling: 4096 makes a schedule of about .* \(at most [0-9]+ here\)$")
flag_case("schedule_prefetch_negative", "schedule", TINY + " --prefetch-depth=-1", INT("--prefetch-depth", 0, 64, "-1") + HELP("schedule"))
flag_case("schedule_prefetch_1e6", "schedule", TINY + " --prefetch-depth 1000000", INT("--prefetch-depth", 0, 64, "1000000") + HELP("schedule"))
flag_case("schedule_prefetch_past_pass", "schedule", TINY + " --prefetch-depth 14", r"--prefetch-depth: expected at most 13 for 2 layer\(s\) \(one pass has 14 parameter groups\), got 14$")
flag_case("schedule_micro_batches_zero", "schedule", TINY + " --strategy l2l --micro-batches 0", INT("--micro-batches", 1, 4096, "0") + HELP("schedule"))
flag_case("schedule_micro_batches_1e6", "schedule", TINY + " --strategy l2l --micro-batches 1000000", INT("--micro-batches", 1, 4096, "1000000") + HELP("schedule"))
# interleaved 1F1B (issue 28, item 3)
SHORT_CFG = "--config {src}/tests/exec/engine/fixtures/short.yaml --steps 1"
flag_case("schedule_virtual_stages_no_pp", "schedule", "--model table1-10B --virtual-stages 2", r"--virtual-stages: interleaving needs pipeline stages \(--pp 2 or more\), got --pp 1$")
flag_case("schedule_virtual_stages_grad_accum", "schedule", "--model table1-10B --pp 4 --virtual-stages 2 --grad-accum 6", r"--grad-accum: interleaved 1F1B runs micro-batches in groups of pp; expected a multiple of --pp 4, got 6$")
flag_case("schedule_virtual_stages_too_many", "schedule", "--model table1-10B --pp 4 --virtual-stages 13 --grad-accum 8", r"--virtual-stages: expected 1 to 12 chunks per pipeline stage")
# the replay's own errors carry the command's prefix once ("memwall simulate: simulate: ..." before)
flag_case("simulate_full_too_many", "simulate", "--model table1-10B --nodes 32 --full", r"--full replays every GPU, at most 256; got 512$")
flag_case("simulate_virtual_stages_zero", "simulate", "--model table1-10B --virtual-stages 0", INT("--virtual-stages", 1, 1024, "0") + HELP("simulate"))
flag_case("run_virtual_stages", "run", SHORT_CFG + " --pp 2 --grad-accum 2 --virtual-stages 2", r"--virtual-stages: expected 1 to 1 chunks per pipeline stage \(each chunk holds at least one of the model's 2 blocks over 2 stage\(s\)\), got 2$")
flag_case("plan_fix_virtual_stages_no_pp", "plan", "--model table1-10B --fix virtual_stages=2", r"--fix virtual_stages=2: interleaving needs pipeline stages")
flag_case("schedule_micro_batches_memory", "schedule", "--model table1-20T --strategy l2l --micro-batches 4096", r"--micro-batches: 4096 makes a schedule of about")
flag_case("schedule_micro_batches_not_l2l", "schedule", TINY + " --strategy zero3 --micro-batches 2", r"--micro-batches: only the layer-major l2l schedule")
flag_case("schedule_layers_memory", "schedule", "--layers 100000 --hidden 1K --heads 8", r"--layers: 100000 makes a schedule of about")
flag_case("schedule_place_disk", "schedule", TINY + " --place param16=disk", r"--place param16: expected a tier \(gpu, cpu or nvme\), got \"disk\"$")
flag_case("schedule_place_state", "schedule", TINY + " --place colour=cpu", r"--place: expected STATE=TIER with STATE one of param16")
flag_case("schedule_place_no_tier", "schedule", TINY + " --place param16", r"--place: expected STATE=TIER, got \"param16\"$")
flag_case("schedule_place_invalid", "schedule", TINY + " --strategy zero2 --place optim32=nvme --place grad16=nvme", r"placement zero2\+optim32=nvme\+grad16=nvme: grad16 on nvme with param16 unpartitioned")
flag_case("schedule_strategy", "schedule", TINY + " --strategy zero4", r"--strategy: unknown strategy \"zero4\"")
flag_case("schedule_json_and_text", "schedule", TINY + " --json --text", r"--json and --text: give one, not both$")
flag_case("schedule_no_model", "schedule", "", r"--model: missing")
flag_case("schedule_bsz_nan", "schedule", TINY + " --bsz nan", NUM("--bsz", "65536", "nan") + HELP("schedule"))
flag_case("schedule_ci_zero", "schedule", TINY + " --ci 0", INT("--ci", 1, 100000, "0") + HELP("schedule"))
flag_case("schedule_ci_above", "schedule", TINY + " --ci 3", r"--ci: expected a checkpoint interval between 1 and the model's 2 layers, got 3$")
flag_case("schedule_output_folder", "schedule", TINY + " -o {tmp}", r".*: is a folder, expected a file name to write$")

SMALL = "--layers 2 --hidden 1K --heads 8"
flag_case("simulate_plan_and_bsz", "simulate", "--plan {src}/tests/corpus/good_plan.yaml --bsz 4", r"--bsz: not used with --plan")
flag_case("simulate_plan_and_strategy", "simulate", "--plan {src}/tests/corpus/good_plan.yaml --strategy zero3", r"--strategy: not used with --plan")
flag_case("simulate_plan_and_model", "simulate", "--plan {src}/tests/corpus/good_plan.yaml --model fig2a-1T", r"--plan: give --plan or --model, not both$")
flag_case("simulate_plan_nodes_mismatch", "simulate", "--plan {src}/tests/corpus/good_plan.yaml --nodes 2", r".*good_plan.yaml:4: nodes: plan names 1 node\(s\), profile dgx2 has 2 \(scale it with --nodes 1\)$")
flag_case("simulate_nodes_zero", "simulate", SMALL + " --nodes 0", INT("--nodes", 1, 65536, "0") + HELP("simulate"))
flag_case("simulate_mp_3", "simulate", SMALL + " --mp 3", r"--mp: tensor slicing stays inside a node of 16 GPUs: expected a divisor of 16, got 3$")
flag_case("simulate_dp_32", "simulate", SMALL + " --dp 32", r"--dp/--mp: 32 x 1 GPUs asked, profile dgx2 has 16")
flag_case("simulate_tiling_1e6", "simulate", SMALL + " --tiling 1000000", INT("--tiling", 1, 4096, "1000000") + HELP("simulate"))
flag_case("simulate_trace_folder", "simulate", SMALL + " --trace {tmp}", r".*: is a folder, expected a file name to write$")
# an empty value is refused, not read as the flag not given (-o '' printed to stdout)
flag_case("plan_output_empty", "plan", "--model table1-10B -o ''", r"-o: expected a value, got an empty string$")
# a checkpoint that does not load is refused before the run's header (which went to stdout first)
flag_case("run_resume_no_checkpoint", "run", "--config {src}/tests/exec/engine/fixtures/short.yaml --steps 1 --resume {tmp}",
          r"--resume [^ ]+: no checkpoint \([^ ]+/latest: No such file or directory\)$")
flag_case("run_resume_empty", "run", "--config {src}/tests/exec/engine/fixtures/short.yaml --steps 1 --resume ''",
          r"--resume: expected a value, got an empty string$")
# a flag twice, a flag before any command
flag_case("analyze_layers_twice", "analyze", "--layers 2 --layers 3 --hidden 256 --heads 4",
          r"--layers: given 2 times; give it once" + HELP("analyze"))
case("flag_top_level_misspelt", "--versio", r"^memwall: --versio: not a flag of memwall \(did you mean --version\?\)")
# plan's outputs: each its own file, exports only of a plan, and a folder made for a command that
# then fails is not left behind
flag_case("plan_deepspeed_is_output", "plan", "--model table1-10B -o {tmp}/p.yaml --deepspeed {tmp}/p.yaml",
          r"--deepspeed: .*p.yaml is also the file -o writes; give each output its own name$")
flag_case("plan_output_is_deepspeed_notes", "plan", "--model table1-10B -o {tmp}/x.notes.txt --deepspeed {tmp}/x",
          r"--deepspeed: .*x.notes.txt is also the file -o writes; give each output its own name$")
flag_case("plan_deepspeed_max_model", "plan", "--max-model-size --strategy zero3 --deepspeed {tmp}/ds.json",
          r"--deepspeed: exports a plan; not used with --max-model-size$")
flag_case("plan_deepspeed_for_megatron", "plan", "--model table1-10B --deepspeed {tmp}/ds.json --for megatron",
          r"--deepspeed: a plan --for megatron is not one DeepSpeed runs as planned; drop --for, or the export$")
flag_case("plan_reproduce_bad_alloc_leaves_no_folder", "plan", "--reproduce fig7 --max-alloc '1 B' -o {tmp}/out",
          r"--max-alloc: expected at least")
# an output is renamed over its name: a FIFO or device there (/dev/null as root) would be replaced
NOT_A_FILE = r"is a device, FIFO or socket; memwall writes its outputs as regular files \(name a file\)$"
flag_case("simulate_trace_fifo", "simulate", SMALL + " --trace {tmp}/fifo.yaml", r"--trace: .*fifo.yaml: " + NOT_A_FILE)
flag_case("plan_output_fifo", "plan", "--model table1-10B -o {tmp}/fifo.yaml", r"-o: .*fifo.yaml: " + NOT_A_FILE)
flag_case("analyze_output_fifo", "analyze", "--model fig2a-1T -o {tmp}/fifo.yaml", r".*fifo.yaml: " + NOT_A_FILE)
flag_case("simulate_no_model", "simulate", "", r"--model: missing")
flag_case("simulate_bsz_inf", "simulate", SMALL + " --bsz inf", NUM("--bsz", "65536", "inf") + HELP("simulate"))

for v in ["-1", "101", "1000000"]:
    flag_case("plan_runners_" + re.sub(r"\W", "_", v), "plan", "--model table1-1T --runners=" + v, INT("--runners", 0, 100, v) + HELP("plan"))
for v in ["-1", "65"]:
    flag_case("plan_simulate_top_" + re.sub(r"\W", "_", v), "plan", "--model table1-1T --simulate-top=" + v, INT("--simulate-top", 0, 64, v) + HELP("plan"))
for v, frag in [("tiling=1000000", r"--fix tiling: expected an integer from 1 to 4096, got \"1000000\"$"),
                ("ci=0", r"--fix ci: expected an integer from 1 to 100000, got \"0\"$"),
                ("mp=x", r"--fix mp: expected an integer from 1 to 1024, got \"x\"$"),
                ("prefetch_depth=65", r"--fix prefetch_depth: expected an integer from 0 to 64, got \"65\"$"),
                ("bsz=0", r"--fix bsz: expected a micro-batch per GPU > 0 and at most 65536, got \"0\"$"),
                ("bsz=inf", r"--fix bsz: expected a micro-batch per GPU > 0 and at most 65536, got \"inf\"$"),
                ("colour=red", r"--fix: unknown key \"colour\""),
                ("strategy=zero9", r"--fix strategy: unknown strategy \"zero9\"$"),
                ("bsz", r"--fix: expected key=value"),
                ("param16=disk", r"--fix param16: expected a tier"),
                ("fetch=scatter", r"--fix fetch: expected allgather or broadcast, got \"scatter\"$")]:
    flag_case("plan_fix_" + re.sub(r"\W", "_", v), "plan", "--model table1-1T --fix " + v, frag)
flag_case("plan_objective", "plan", "--model table1-1T --objective fastest", r"--objective: expected throughput or max-model, got \"fastest\"$")
flag_case("plan_max_alloc_zero", "plan", "--model table1-1T --max-alloc '0 B'", r"--max-alloc: expected at least 4.00 KiB")
flag_case("plan_max_alloc_huge", "plan", "--model table1-1T --max-alloc '1e30 GiB'", r"--max-alloc: expected at least 4.00 KiB and at most 1024 EiB, got \"1e30 GiB\"$")
flag_case("plan_max_alloc_word", "plan", "--model table1-1T --max-alloc big", r"--max-alloc: expected a size")
flag_case("plan_reproduce", "plan", "--reproduce fig9", r"--reproduce: expected fig6 or fig7, got \"fig9\"$")
flag_case("plan_max_model_no_strategy", "plan", "--max-model-size", r"--strategy: missing")
flag_case("plan_max_model_with_model", "plan", "--max-model-size --strategy zero3 --model table1-1T", r"--model: not used with --max-model-size")
flag_case("plan_strategy_and_fix", "plan", "--model table1-1T --strategy zero3 --fix strategy=zero2", r"--strategy: give --strategy zero3 or --fix strategy=zero2, not both")
flag_case("plan_layers_memory", "plan", "--layers 100000 --hidden 1K --heads 8", r"--layers: 100000 makes a schedule of about")
flag_case("plan_no_model", "plan", "", r"--model: missing")
flag_case("plan_output_missing_folder", "plan", "--layers 4 --hidden 1K --heads 16 -o {tmp}/no/p.yaml", r".*/no/p.yaml: its folder .*/no does not exist \(make it first\)$")
# Destinations are checked before any work (issue 30, item 4): each of these would compute for
# seconds to minutes first if the check came at the end.
NOFOLDER = lambda flag, path: esc(flag) + r": .*/no/" + esc(path) + r": its folder .*/no does not exist \(make it first\)$"
flag_case("plan_search_output_missing_folder", "plan", "--model table1-1T -o {tmp}/no/p.yaml", NOFOLDER("-o", "p.yaml"))
flag_case("plan_deepspeed_missing_folder", "plan", "--model table1-1T --deepspeed {tmp}/no/ds.json", NOFOLDER("--deepspeed", "ds.json"))
flag_case("plan_reproduce_output_is_file", "plan", "--reproduce fig6 -o /proc/version", r"-o: /proc/version: not a folder$")
flag_case("schedule_output_missing_folder", "schedule", "--model table1-1T -o {tmp}/no/s.txt", NOFOLDER("-o", "s.txt"))
flag_case("simulate_trace_missing_folder", "simulate", "--model table1-1T --trace {tmp}/no/t.json", NOFOLDER("--trace", "t.json"))
flag_case("analyze_output_is_folder", "analyze", "--model table1-1T -o /tmp", r"-o: /tmp: is a folder, expected a file name to write$")
flag_case("calibrate_output_missing_folder", "calibrate", "--quick --nvme-dir {tmp} -o {tmp}/no/p.yaml", NOFOLDER("-o", "p.yaml"))
flag_case("reproduce_output_is_file", "reproduce", "-o /proc/version", r"-o: /proc/version: not a folder$")
flag_case("plan_deepspeed_folder", "plan", "--layers 4 --hidden 1K --heads 16 --deepspeed {tmp}", r".*: is a folder, expected a file name to write$")
flag_case("plan_nodes_huge", "plan", "--model table1-1T --nodes 1000000", INT("--nodes", 1, 65536, "1000000") + HELP("plan"))

flag_case("reproduce_figure", "reproduce", "--figure fig99 -o {tmp}/out", r"--figure: expected one of fig5a, .* or all, got \"fig99\"$")
flag_case("reproduce_profile", "reproduce", "--profile dgx9 -o {tmp}/out", r"dgx9: no such profile file")
flag_case("reproduce_output_file", "reproduce", "--figure fig5c -o {src}/README.md", r"-o: .*README.md: not a folder$")

D = "--dir {tmp}"
for v in ["0", "4097", "-1", "abc"]:
    flag_case("io_bench_qd_" + re.sub(r"\W", "_", v), "io-bench", D + " --qd=" + v, INT("--qd", 1, 4096, v) + HELP("io-bench"))
for v in ["0", "65"]:
    flag_case("io_bench_rings_" + v, "io-bench", D + " --rings " + v, INT("--rings", 1, 64, v) + HELP("io-bench"))
flag_case("io_bench_engine", "io-bench", D + " --engine aio", r"--engine: expected uring or psync, got \"aio\"$")
flag_case("io_bench_block_unaligned", "io-bench", D + " --block 1000B", r"--block: expected a multiple of 4 KiB")
flag_case("io_bench_block_zero", "io-bench", D + " --block 0B", r"--block: expected a positive value|--block: expected at least")
flag_case("io_bench_block_huge", "io-bench", D + " --block 2GiB", r"--block: expected at least 1.00 B and at most 1.00 GiB, got \"2GiB\"$")
flag_case("io_bench_block_word", "io-bench", D + " --block big", r"--block: expected a size")
flag_case("io_bench_size_nounit", "io-bench", D + " --size 5", r"--size: expected a size .*unit is required")
flag_case("io_bench_size_not_blocks", "io-bench", D + " --size 1536KiB", r"--size: expected a whole number of --block \(1.00 MiB\) blocks, got 1536KiB$")
flag_case("io_bench_size_free_space", "io-bench", D + " --size 1PiB", r"--size: 1.00 PiB does not fit in .* free\)$")
flag_case("io_bench_size_inf", "io-bench", D + " --size 'inf GiB'", r"--size: expected a finite number")
flag_case("io_bench_psync_threads", "io-bench", D + " --engine psync --qd 4096", r"--qd: the psync engine runs one thread per request in flight: at most 1024, got 4096$")
flag_case("io_bench_window_memory", "io-bench", D + " --qd 4096 --block 1GiB --size 1GiB", r"--qd/--block: 8192 buffers of 1.00 GiB \(8.00 TiB\) are more than a quarter of this machine's")
flag_case("io_bench_dir_missing", "io-bench", "--dir {tmp}/nope", r"--dir: .*/nope: no such directory$")
flag_case("io_bench_dir_file", "io-bench", "--dir {src}/README.md", r"--dir: .*README.md: not a directory$")
flag_case("io_bench_dir_loop", "io-bench", "--dir {tmp}/loop_a.yaml", r"--dir: .*loop_a.yaml: Too many levels of symbolic links$")
flag_case("io_bench_no_dir", "io-bench", "--size 4MiB", r"--dir is required" + HELP("io-bench"))

for v in ["-1", "100000"]:
    flag_case("adam_bench_threads_" + re.sub(r"\W", "_", v), "adam-bench", "--threads=" + v, r"--threads: expected an integer from 0 to [0-9]+, got \"%s\"" % esc(v) + HELP("adam-bench"))
for v in ["0", "1000000000"]:
    flag_case("adam_bench_repeats_" + v, "adam-bench", "--repeats " + v, INT("--repeats", 1, 1000, v) + HELP("adam-bench"))
flag_case("adam_bench_work", "adam-bench", "--params 150M --repeats 1000", r"--repeats: 1000 x 150 M params is more than 100 B parameter updates")
for v, frag in [("0", r"--params: expected a whole number of parameters >= 1"), ("-5", r"--params: expected a whole number of parameters >= 1"),
                ("1e30", r"--params: expected at most 1e15 parameters, got \"1e30\"$"), ("lots", r"--params: expected a whole number"),
                ("1.5", r"--params: expected a whole number"), ("nan", r"--params: expected a whole number"),
                ("100T", r"--params: 100 T parameters need [0-9.]+ PiB of memory")]:
    flag_case("adam_bench_params_" + re.sub(r"\W", "_", v), "adam-bench", "--params=" + v, frag)
flag_case("adam_bench_dtype", "adam-bench", "--dtype fp8", r"--dtype: expected bf16 or fp16, got \"fp8\"$")
flag_case("adam_bench_grad_dtype", "adam-bench", "--grad-dtype int8", r"--grad-dtype: expected fp32, fp16 or bf16, got \"int8\"$")
flag_case("adam_bench_isa", "adam-bench", "--isa sse9", r"--isa: expected scalar, avx2 or avx512, got \"sse9\"$")

SHORT = "--config {src}/tests/exec/engine/fixtures/short.yaml --steps 1"
flag_case("run_nodes_zero", "run", SHORT + " --nodes 0", INT("--nodes", 1, 65536, "0") + HELP("run"))
flag_case("run_bsz_zero", "run", SHORT + " --bsz 0", NUM("--bsz", "65536", "0") + HELP("run"))
flag_case("run_dp_zero", "run", SHORT + " --dp 0", INT("--dp", 1, 67108864, "0") + HELP("run"))
flag_case("run_tiling_zero", "run", SHORT + " --tiling 0", INT("--tiling", 1, 4096, "0") + HELP("run"))
flag_case("run_tiling_1e6", "run", SHORT + " --tiling 1000000", INT("--tiling", 1, 4096, "1000000") + HELP("run"))
flag_case("run_prefetch_1e6", "run", SHORT + " --prefetch-depth 1000000", INT("--prefetch-depth", 0, 64, "1000000") + HELP("run"))
flag_case("run_strategy", "run", SHORT + " --strategy zero9", r"--strategy: unknown strategy \"zero9\"")
flag_case("run_place", "run", SHORT + " --place param16=disk", r"--place param16: expected a tier")
flag_case("run_profile", "run", SHORT + " --profile dgx9", r"dgx9: no such profile file")
flag_case("run_plan_missing", "run", "--plan {tmp}/nope.yaml", r".*nope.yaml: no such plan file$")
# issue 30: sentinels refused, destinations checked before any work
flag_case("run_steps_zero", "run", SHORT.replace(" --steps 1", "") + " --steps 0", INT("--steps", 1, 1000000000, "0") + HELP("run"))
flag_case("run_save_every_zero", "run", SHORT + " --save {tmp}/ck --save-every 0", INT("--save-every", 1, 1000000000, "0") + HELP("run"))
flag_case("run_bsz_denormal", "run", SHORT + " --bsz 1e-320", NUM("--bsz", "65536", "1e-320") + r" \(too small to compute with\)" + HELP("run"))
flag_case("analyze_bsz_denormal", "analyze", M1T + " --bsz 1e-320", NUM("--bsz", "65536", "1e-320") + r" \(too small to compute with\)" + HELP("analyze"))
flag_case("run_save_file", "run", SHORT + " --save {src}/README.md", r"--save: .*README.md: not a folder$")
flag_case("run_save_no_parent", "run", SHORT + " --save {tmp}/no/ck", r"--save: .*ck: its folder .*no does not exist \(make it first\)$")
flag_case("run_save_proc", "run", SHORT + " --save /proc", r"--save: /proc: not writable")
flag_case("run_trace_folder", "run", SHORT + " --trace {src}", r"--trace: .*: is a folder, expected a file name to write$")
flag_case("run_trace_no_parent", "run", SHORT + " --trace {tmp}/no/t.json", r"--trace: .*t.json: its folder .*/no does not exist \(make it first\)$")
flag_case("run_plan_folder", "run", "--plan {tmp}/folder.yaml", r".*folder.yaml: is a folder, not a plan file$")

# calibrate and validate (issue 15)
flag_case("calibrate_no_nvme_dir", "calibrate", "", r"--nvme-dir is required" + HELP("calibrate"))
flag_case("calibrate_nvme_dir_missing", "calibrate", "--nvme-dir {tmp}/nope", r".*nope: not a folder$")
flag_case("calibrate_backend", "calibrate", "--nvme-dir {tmp} --backend tpu", r"--backend: expected cpu or cuda, got \"tpu\"$")
flag_case("calibrate_hidden_zero", "calibrate", "--nvme-dir {tmp} --hidden 0", r"--hidden: expected sizes from 1 to 65536, got 0$")
flag_case("calibrate_hidden_not_heads", "calibrate", "--nvme-dir {tmp} --hidden 100", r"--hidden: 100 is not a multiple of the head size 64$")
flag_case("calibrate_kernel_hidden", "calibrate", "--nvme-dir {tmp} --kernel-hidden 0", INT("--kernel-hidden", 1, 65536, "0") + HELP("calibrate"))
flag_case("calibrate_bsz", "calibrate", "--nvme-dir {tmp} --bsz 0", INT("--bsz", 1, 4096, "0") + HELP("calibrate"))
flag_case("calibrate_precision", "calibrate", "--nvme-dir {tmp} --precision fp8", r"--precision: expected fp32, fp16 or bf16, got \"fp8\"$")
flag_case("calibrate_device_memory", "calibrate", "--nvme-dir {tmp} --device-memory 1e30GiB", r"--device-memory: ")
flag_case("calibrate_nvme_size", "calibrate", "--nvme-dir {tmp} --nvme-size 1KiB", r"--nvme-size: ")
VSHORT = "--config {src}/tests/exec/engine/fixtures/short.yaml"
flag_case("validate_no_config", "validate", "", r"--config: missing \(or give --plan\)$")
flag_case("validate_one_step", "validate", VSHORT + " --steps 1", r"--steps: expected at least 2 \(one warm-up, one measured\), got 1$")
flag_case("validate_trace_dir", "validate", VSHORT + " --trace-dir {tmp}/no/nope", r"--trace-dir: .*nope: its folder .*no does not exist \(make it first\)$")
flag_case("validate_trace_dir_file", "validate", VSHORT + " --trace-dir {src}/README.md", r"--trace-dir: .*README.md: not a folder$")
flag_case("validate_top", "validate", VSHORT + " --top -1", INT("--top", 0, 1000, "-1") + HELP("validate"))
flag_case("validate_strategy", "validate", VSHORT + " --strategy zero9", r"--strategy: unknown strategy \"zero9\"")
flag_case("validate_onebit", "validate", VSHORT + " --onebit-adam", r"--onebit-adam: 1-bit Adam is a what-if")
flag_case("validate_profile", "validate", VSHORT + " --profile dgx9", r"dgx9: no such profile file")

case("top_no_command", "", r"^memwall: A subcommand is required")
case("top_unknown_command", "frobnicate", r"^memwall: unknown command \"frobnicate\" \(see memwall --help\)$")
case("top_models_extra", "models --all", r"^memwall models: --all: not a flag of memwall models")
case("top_profiles_extra", "profiles extra", r"^memwall profiles: unexpected argument \"extra\"")


# ------------------------------------------------------------------------------------------------
def render():
    out = ["# memwall's bad-input corpus: written by make_corpus.py, run by run_corpus.py (see both).\n",
           "# name\tstatus\tstderr regex\targuments\n"]
    for name, status, regex, args in cases:
        out.append("%s\t%s\t%s\t%s\n" % (name, status, regex, args))
    return "".join(out)


def main():
    check = "--check" in sys.argv[1:]
    fdir = os.path.join(HERE, "files")
    want = {name: text for name, text in files.items()}
    table = render()
    if check:
        bad = []
        if open(os.path.join(HERE, "cases.tsv")).read() != table:
            bad.append("cases.tsv")
        have = set(os.listdir(fdir)) if os.path.isdir(fdir) else set()
        for name, text in want.items():
            p = os.path.join(fdir, name)
            if name not in have or open(p, "rb").read() != text.encode():
                bad.append("files/" + name)
        bad += ["files/" + n + " (stale)" for n in sorted(have - set(want))]
        if bad:
            print("make_corpus.py --check: out of date, run tests/corpus/make_corpus.py: " + ", ".join(bad[:10]))
            return 1
        print("make_corpus.py --check: %d cases, %d files, up to date" % (len(cases), len(want)))
        return 0
    os.makedirs(fdir, exist_ok=True)
    for n in os.listdir(fdir):
        if n not in want:
            os.remove(os.path.join(fdir, n))
    for name, text in want.items():
        with open(os.path.join(fdir, name), "wb") as f:
            f.write(text.encode())
    with open(os.path.join(HERE, "cases.tsv"), "w") as f:
        f.write(table)
    print("make_corpus.py: %d cases, %d files" % (len(cases), len(want)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
