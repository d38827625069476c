#include "cli/cli_common.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "exec/io/temp_file.hpp"
#include "exec/io/user_files.hpp"
#include "model/units.hpp"

namespace memwall::cli {

namespace {

long parse_int_flag(const std::string& name, const std::string& text, long lo, long hi) {
  long v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
    throw CLI::ValidationError(name, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                                         ", got \"" + text + "\"");
  return v;
}

// `set` receives a value already checked against [lo, hi], so narrowing it is safe.
CLI::Option* add_int_impl(CLI::App& app, const std::string& name, std::function<void(long)> set, long lo, long hi,
                          const std::string& help) {
  return app
      .add_option_function<std::string>(
          name, [set, name, lo, hi](const std::string& s) { set(parse_int_flag(name, s, lo, hi)); }, help)
      ->type_name("INT");
}

}  // namespace

CLI::Option* add_int(CLI::App& app, const std::string& name, int& target, long lo, long hi, const std::string& help) {
  return add_int_impl(app, name, [&target](long v) { target = int(v); }, lo, std::min<long>(hi, INT_MAX), help)
      ->default_str(std::to_string(target));
}
CLI::Option* add_int(CLI::App& app, const std::string& name, long& target, long lo, long hi, const std::string& help) {
  return add_int_impl(app, name, [&target](long v) { target = v; }, lo, hi, help)->default_str(std::to_string(target));
}
CLI::Option* add_int(CLI::App& app, const std::string& name, std::optional<int>& target, long lo, long hi,
                     const std::string& help) {
  return add_int_impl(app, name, [&target](long v) { target = int(v); }, lo, std::min<long>(hi, INT_MAX), help);
}
CLI::Option* add_int(CLI::App& app, const std::string& name, std::optional<long>& target, long lo, long hi,
                     const std::string& help) {
  return add_int_impl(app, name, [&target](long v) { target = v; }, lo, hi, help);
}

CLI::Option* add_number(CLI::App& app, const std::string& name, double& target, double hi, const std::string& help) {
  return app
      .add_option_function<std::string>(
          name,
          [&target, name, hi](const std::string& text) {
            double v = 0;
            auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !(v > 0) || !(v <= hi))
              throw CLI::ValidationError(name, "expected a number > 0 and at most " + format_g(hi) + ", got \"" + text +
                                                   "\"");
            if (!std::isnormal(v))  // a denormal: 1e-320 would print 9.88e-324 TFLOP and "fits"
              throw CLI::ValidationError(name, "expected a number > 0 and at most " + format_g(hi) + ", got \"" + text +
                                                   "\" (too small to compute with)");
            target = v;
          },
          help)
      ->type_name("NUM")
      ->default_str(format_g(target));
}

double parse_quantity_flag(const std::string& flag, const std::string& text, Dimension d, double lo, double hi) {
  Result<double> v = parse_quantity(text, d);
  if (!v) throw UsageError(flag + ": " + v.error());
  const QuantityRange range = quantity_range(d);
  lo = std::max(lo, range.min);
  hi = std::min(hi, range.max);
  if (!(*v >= lo) || !(*v <= hi) || (d == Dimension::count && !(*v > 0)))
    throw UsageError(flag + ": expected " + (d == Dimension::count && lo <= 0 ? "more than 0" : "at least " + format_quantity(lo, d)) +
                     " and at most " + format_quantity(hi, d) + ", got \"" + text + "\"");
  return *v;
}

void ProfileFlags::add(CLI::App& app) {
  app.add_option("--profile", profile,
                 "Hardware profile: a built-in name (dgx2, dgx2-superpod, dgx-a100, dgx-h100, gh200, workstation, "
                 "local-cpu) or a path to a YAML file")
      ->capture_default_str();
  add_int(app, "--nodes", nodes, 1, kMaxNodes, "Scale the profile to N identical nodes (default: as the profile says)");
}

void ProfileFlags::add_gpus(CLI::App& app) {
  add_int(app, "--gpus", gpus, 1, kMaxGpus,
          "GPUs per node to use (default: all the profile has); more than it has only for a profile that\n"
          "`memwall run` executes (executor: in the YAML, e.g. local-cpu: one device per mpirun rank)");
}

HardwareProfile ProfileFlags::load() const {
  HardwareProfile p = take(load_profile(profile));
  if (gpus) {
    if (*gpus > p.gpus_per_node && p.executor_backend.empty())
      throw UsageError("--gpus: the profile " + p.name + " has " + std::to_string(p.gpus_per_node) +
                       " GPUs per node, asked for " + std::to_string(*gpus));
    p.gpus_per_node = *gpus;
  }
  if (nodes) p = take(scale_to_nodes(p, *nodes));
  return p;
}

void ModelFlags::add(CLI::App& app) {
  app.add_option("--model", model,
                 "Model: a catalogue name (memwall models lists them), a model YAML file, or a config.json");
  app.add_option("--model-config", model_config,
                 "A Hugging Face config.json (model_type llama, mistral, mixtral, qwen2, gpt2, gpt_neox); a field\n"
                 "that changes memory or time in a way memwall does not model is refused by name");
  add_int(app, "--layers", layers, 1, kMaxLayers, "Transformer layers (with --hidden and --heads, instead of --model)");
  app.add_option("--hidden", hidden, "Hidden size, e.g. 8192 or 8K (K = 1024)");
  add_int(app, "--heads", heads, 1, kMaxHeads, "Attention heads");
  add_int(app, "--seq", seq, 1, kMaxSeq, "Sequence length (default: the model's, 1024 for the paper's models)");
  add_int(app, "--vocab", vocab, 1, kMaxVocab, "Vocabulary size (default 50257)");
}

ModelSpec ModelFlags::load() const {
  ModelSpec m;
  bool shape = layers || !hidden.empty() || heads;
  if (!model.empty() && shape) throw UsageError("--model: give either --model or --layers/--hidden/--heads, not both");
  if (!model_config.empty() && (shape || !model.empty()))
    throw UsageError("--model-config: give one of --model-config, --model or --layers/--hidden/--heads");
  if (!model_config.empty()) {
    if (!model_config.ends_with(".json"))
      throw UsageError("--model-config: expected a Hugging Face config.json file, got \"" + model_config + "\"");
    m = take(load_model(model_config));
  } else if (!model.empty()) {
    m = take(load_model(model));
  } else {
    if (!layers) throw UsageError("--layers: missing (expected an integer >= 1 with --hidden and --heads)");
    if (hidden.empty()) throw UsageError("--hidden: missing (expected a hidden size such as 8192 or 8K)");
    if (!heads) throw UsageError("--heads: missing (expected an integer >= 1 that divides --hidden)");
    Result<long> h = parse_hidden(hidden);
    if (!h) throw UsageError("--hidden: " + h.error());
    m = take(model_from_shape(*layers, *h, *heads));
  }
  if (seq) m.seq = *seq;
  if (vocab) m.vocab = *vocab;
  return m;
}

void add_what_if_flags(CLI::App& app, WhatIf& w) {
  app.add_flag("--onebit-adam", w.onebit_adam,
               "What-if (seed 004): 1-bit Adam's compression stage: gradient collectives carry 1 bit per element\n"
               "plus fp32 scales, and fp32 error feedback (4 B/param) lives beside the optimizer states");
  app.add_option_function<std::string>(
         "--onebit-adam-warmup",
         [&w](const std::string& text) {
           double v = -1;
           auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
           if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !(v >= 0) || !(v < 1))
             throw CLI::ValidationError("--onebit-adam-warmup",
                                        "expected a share of the training steps >= 0 and below 1, got \"" + text + "\"");
           w.onebit_warmup = v;
         },
         "1-bit Adam: share of training steps run as plain Adam first, for end-to-end averages (the blog's 0.15)")
      ->type_name("NUM")
      ->default_str(format_g(w.onebit_warmup));
  add_number(app, "--attention-density", w.attention_density, 1.0,
             "What-if (seed 004): block-sparse attention computing this share of the score blocks (0 < D <= 1);\n"
             "scales attention FLOPs and Eq. 5's score-matrix term");
}

void add_grad_clip_flag(CLI::App& app, double& clip) {
  app.add_option_function<std::string>(
         "--grad-clip",
         [&clip](const std::string& text) {
           double v = -1;
           auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
           if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !(v >= 0) || !(v <= kMaxGradClip) ||
               (v > 0 && !std::isnormal(v)))
             throw CLI::ValidationError("--grad-clip", "expected the largest global gradient norm, a number > 0 and at most " +
                                                           format_g(kMaxGradClip) + " (0: no clipping), got \"" + text + "\"");
           clip = v;
         },
         "Gradient-norm clipping: scale each step's gradients by min(1, N / (global L2 norm + 1e-6)), as\n"
         "torch.nn.utils.clip_grad_norm_ (0: off, the default); the norm needs every gradient, so\n"
         "--optimizer-overlap backward is refused with it")
      ->type_name("N")
      ->default_str("0");
}

void StrategyFlags::add(CLI::App& app) {
  const std::size_t before = app.get_options().size();
  app.add_option("--strategy", strategy,
                 "Placement preset (data_parallel, zero2, zero_offload, zero3, zero_inf_cpu, zero_inf_nvme, three_d, "
                 "l2l) or a placement YAML file")
      ->capture_default_str();
  app.add_option("--place", place, "Override one state's tier: param16=cpu, optim32=nvme, act_ckpt=cpu ...");
  add_number(app, "--bsz", config.bsz, kMaxBsz, "Micro-batch per GPU");
  add_int(app, "--ci", config.ci, 1, kMaxLayers, "Transformer blocks between activation checkpoints");
  add_int(app, "--tiling", config.tiling_factor, 1, kMaxTiling, "Memory-centric tiling factor for linear layers");
  add_int(app, "--prefetch-depth", config.prefetch_depth, 0, kMaxPrefetchDepth,
          "Prefetch distance d: nc i+d, cg i+d-1, gg i+d-2; 0 fetches on demand (each copy to the GPU and\n"
          "all-gather after the previous operator, as ZeRO-3 in DeepSpeed v0.3.15-v0.5.10)");
  add_int(app, "--dp", config.dp, 1, kMaxGpus, "Data-parallel degree (default: all GPUs / mp)")->default_str("");
  add_int(app, "--mp", config.mp, 1, kMaxMp, "Tensor-slicing degree inside a node");
  add_int(app, "--ep", config.ep, 1, kMaxExperts,
          "Expert parallelism (a mixture of experts): the routed experts split over ep consecutive data-parallel\n"
          "ranks, tokens exchanged all-to-all before and after them; divides dp and the experts (run: 1)");
  add_int(app, "--micro-batches", micro_batches, 1, kMaxMicroBatches,
          "l2l: micro-batches looped inside each layer (default 4; 1 runs one)");
  add_int(app, "--pp", config.pp, 1, kMaxPp,
          "Pipeline stages (3D parallelism): contiguous blocks per stage, stages across nodes, the\n"
          "--grad-accum micro-batches run 1F1B (bubble (pp-1)/(m+pp-1)); plan, schedule and simulate (run: 1)");
  add_int(app, "--virtual-stages", config.virtual_stages, 1, kMaxPp,
          "Interleaved 1F1B (Megatron-LM's virtual pipeline): each of the --pp stages holds this many chunks\n"
          "of blocks, chunk k of stage s the (k pp + s)-th of pp x v; the bubble shrinks to (pp-1)/(v m+pp-1)\n"
          "at v times the activation messages; --grad-accum a multiple of pp");
  add_int(app, "--grad-accum", config.grad_accum, 1, kMaxGradAccum,
          "Gradient accumulation: forward/backward micro-steps per optimizer step (global batch =\n"
          "bsz x grad-accum x dp); the optimizer runs once per step");
  app.add_option("--optimizer-overlap", overlap,
                 "When CPU Adam runs: none (after backward, Sec. 5.2.2), backward (each chunk as soon as its\n"
                 "gradients are final, beside the rest of backward: exact), dpu (ZeRO-Offload's delayed parameter\n"
                 "update beside the next forward and backward: one step stale, after --dpu-warmup steps)")
      ->capture_default_str();
  add_int(app, "--dpu-warmup", config.dpu_warmup, 0, kMaxDpuWarmup, "dpu: ordinary steps before the delayed update");
  add_int(app, "--optimizer-chunks", config.optimizer_chunks, 0, kMaxOptimizerChunks,
          "Chunks of the NVMe optimizer pipeline (0: at least 16, within the pinned budget)");
  app.add_flag("--sync-grad-copies", config.sync_grad_copies,
               "ZeRO-Offload's owner scheme (zero_offload, dp > 1) as DeepSpeed's stage 2 ran it before v0.4.0:\n"
               "each gradient copy to CPU memory holds up the owner's next backward compute, so the owners copy\n"
               "one rank at a time (the paper's Fig. 8 baseline); memwall's executor copies beside the backward");
  app.add_flag("--sync-fetches", config.sync_fetches,
               "ZeRO-3 as DeepSpeed v0.3.15-v0.5.x ran it: the device is synchronized before each parameter's\n"
               "all-gather, so every fetch to the GPU waits for all of the rank's earlier device work (no prefetch\n"
               "beside a compute; gradient collectives and copies exposed); NVMe reads and writes still overlap");
  add_what_if_flags(app, config.what_if);
  add_grad_clip_flag(app, config.grad_clip);
  flags.clear();
  const std::vector<CLI::Option*> now = app.get_options();
  for (std::size_t i = before; i < now.size(); ++i) flags.push_back("--" + now[i]->get_lnames().front());
}

void StrategyFlags::refuse_with_plan(const CLI::App& app) const {
  for (const std::string& flag : flags)
    if (app.count(flag) > 0)
      throw UsageError(flag + ": not used with --plan (the plan fixes the placement and training; edit the plan "
                       "file, or plan again with --fix)");
}

Placement StrategyFlags::placement() const { return take(load_placement(strategy, place)); }

TrainingConfig StrategyFlags::training(const ModelSpec& model, const Placement& pl, const HardwareProfile& p,
                                       bool one_stage) const {
  TrainingConfig c = config;
  c.optimizer_overlap = take(parse_optimizer_overlap(overlap));
  c.seq = model.seq;
  if (micro_batches) c.micro_batches = *micro_batches;
  else if (pl.layer_major) c.micro_batches = 4;  // l2l's default; an explicit --micro-batches 1 stays 1
  c = take(validate_ranges(c, model.layers));
  check_ckpt_partition(pl, c.mp);
  c = take(fit_to_profile(c, p));
  ModelSpec built = model;  // the blocks whose steps are built
  if (one_stage && c.pp > 1) {
    built.layers = 0;
    for (int s = 0; s < c.pp; ++s)
      built.layers = std::max(built.layers, stage_block_count(model.layers, c.pp, c.virtual_stages, s));
  }
  return take(check_schedule_size(built, pl, c, p));
}

void StrategyFlags::check_ckpt_partition(const Placement& pl, int mp) const {
  if (!pl.act_ckpt.partitioned || mp > 1) return;  // the schedule refuses it too; here the input is named
  const bool file = strategy.ends_with(".yaml") || strategy.ends_with(".yml");
  const bool by_flag = std::any_of(place.begin(), place.end(), [](const std::string& o) { return o.starts_with("act_ckpt="); });
  throw UsageError((file && !by_flag ? strategy + ": act_ckpt.partitioned" : std::string("--place act_ckpt")) +
                   ": partitioned checkpoints are split across the tensor-slicing ranks (DeepSpeed's "
                   "partition_activations); with --mp 1 there is nothing to split (partitioned: false, or --mp > 1)");
}

std::string layout_words(int dp, int mp, int pp, int virtual_stages) {
  return "dp " + std::to_string(dp) + (mp > 1 ? ", mp " + std::to_string(mp) : "") +
         (pp > 1 ? ", pp " + std::to_string(pp) : "") +
         (virtual_stages > 1 ? " interleaved x" + std::to_string(virtual_stages) : "");
}

std::string render_table(const std::vector<std::vector<std::string>>& rows, int indent) {
  std::vector<size_t> width;
  std::vector<bool> numeric;  // right-align columns whose body cells all start with a digit
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t i = 0; i < rows[r].size(); ++i) {
      if (width.size() <= i) {
        width.push_back(0);
        numeric.push_back(true);
      }
      width[i] = std::max(width[i], rows[r][i].size());
      if (r > 0 && (rows[r][i].empty() || !std::isdigit(static_cast<unsigned char>(rows[r][i][0]))))
        numeric[i] = false;
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line(indent, ' ');
    for (size_t i = 0; i < r.size(); ++i) {
      std::string pad(width[i] - r[i].size(), ' ');
      line += numeric[i] ? pad + r[i] : r[i] + pad;
      if (i + 1 < r.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty() || path == "-") return;
  if (Result<bool> r = io::check_output_file(path); !r) throw UsageError(flag + ": " + r.error());
}

namespace {
std::vector<std::string> made_folders;  // the main thread's, before any worker starts
}  // namespace

void make_output_folder(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(std::filesystem::symlink_status(path, ec));
  if (Result<bool> r = io::make_output_folder(path); !r) throw UsageError(flag + ": " + r.error());
  if (!existed) made_folders.push_back(path);
}

const std::vector<std::string>& made_output_folders() { return made_folders; }

void write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::cout << text;
    std::cout.flush();
    if (!std::cout) throw UsageError("stdout: write failed (disk full or closed?)");
    return;
  }
  if (Result<bool> r = io::write_output_file(path, text); !r) throw UsageError(r.error());
}

void TokensFlag::add(CLI::App& app) {
  app.add_option("--tokens", tokens,
                 "Tokens to train, for the time-to-train figure (\"300B\", \"2T\"); default 20 per parameter\n"
                 "(the compute-optimal budget of Hoffmann et al. 2022)");
}

double TokensFlag::value() const {
  return tokens.empty() ? 0 : parse_quantity_flag("--tokens", tokens, Dimension::count, 1, 1e18);
}

nlohmann::ordered_json throughput_json(const Throughput& t) {
  return {{"tokens_per_step", t.tokens_per_step},
          {"tokens_per_s", t.tokens_per_s},
          {"tokens_per_s_per_gpu", t.tokens_per_s_per_gpu},
          {"model_tflops_per_gpu", t.model_flops_per_s_per_gpu / 1e12},
          {"hardware_tflops_per_gpu", t.hardware_flops_per_s_per_gpu / 1e12},
          {"mfu", t.mfu},
          {"hfu", t.hfu},
          {"mfu_peak_flops_per_s", t.peak_flops_per_s},
          {"mfu_peak", t.peak_source},
          {"train_tokens", t.train_tokens},
          {"train_s", t.train_s}};
}

}  // namespace memwall::cli
