#include "cli/cli_common.hpp"

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "model/units.hpp"

namespace memwall::cli {

void ProfileFlags::add(CLI::App& app) {
  app.add_option("--profile", profile,
                 "Hardware profile: a built-in name (dgx2, dgx2-superpod, dgx-a100, dgx-h100, gh200, workstation) "
                 "or a path to a YAML file")
      ->capture_default_str();
  app.add_option("--nodes", nodes, "Scale the profile to N identical nodes (default: as the profile says)");
}

HardwareProfile ProfileFlags::load() const {
  HardwareProfile p = take(load_profile(profile));
  if (nodes != -1) p = take(scale_to_nodes(p, nodes));
  return p;
}

void ModelFlags::add(CLI::App& app) {
  app.add_option("--model", model, "Model: a catalogue name (memwall models lists them) or a model YAML file");
  app.add_option("--layers", layers, "Transformer layers (with --hidden and --heads, instead of --model)");
  app.add_option("--hidden", hidden, "Hidden size, e.g. 8192 or 8K (K = 1024)");
  app.add_option("--heads", heads, "Attention heads");
  app.add_option("--seq", seq, "Sequence length (default: the model's, 1024 for the paper's models)");
  app.add_option("--vocab", vocab, "Vocabulary size (default 50257)");
}

ModelSpec ModelFlags::load() const {
  ModelSpec m;
  bool shape = layers > 0 || !hidden.empty() || heads > 0;
  if (!model.empty() && shape) throw UsageError("--model: give either --model or --layers/--hidden/--heads, not both");
  if (!model.empty()) {
    m = take(load_model(model));
  } else {
    if (layers <= 0) throw UsageError("--layers: missing (expected an integer >= 1 with --hidden and --heads)");
    if (hidden.empty()) throw UsageError("--hidden: missing (expected a hidden size such as 8192 or 8K)");
    if (heads <= 0) throw UsageError("--heads: missing (expected an integer >= 1 that divides --hidden)");
    Result<long> h = parse_hidden(hidden);
    if (!h) throw UsageError("--hidden: " + h.error());
    m = take(model_from_shape(layers, *h, heads));
  }
  if (seq < 0) throw UsageError("--seq: expected a sequence length >= 1, got " + std::to_string(seq));
  if (seq > 0) m.seq = seq;
  if (vocab < 0) throw UsageError("--vocab: expected a vocabulary size >= 1, got " + std::to_string(vocab));
  if (vocab > 0) m.vocab = vocab;
  return m;
}

void StrategyFlags::add(CLI::App& app) {
  app.add_option("--strategy", strategy,
                 "Placement preset (data_parallel, zero2, zero_offload, zero3, zero_inf_cpu, zero_inf_nvme, three_d, "
                 "l2l) or a placement YAML file")
      ->capture_default_str();
  app.add_option("--place", place, "Override one state's tier: param16=cpu, optim32=nvme, act_ckpt=cpu ...");
  app.add_option("--bsz", config.bsz, "Micro-batch per GPU")->capture_default_str();
  app.add_option("--ci", config.ci, "Transformer blocks between activation checkpoints")->capture_default_str();
  app.add_option("--tiling", config.tiling_factor, "Memory-centric tiling factor for linear layers")
      ->capture_default_str();
  app.add_option("--prefetch-depth", config.prefetch_depth, "Prefetch distance d: nc i+d, cg i+d-1, gg i+d-2")
      ->capture_default_str();
  app.add_option("--dp", config.dp, "Data-parallel degree (default: all GPUs / mp)");
  app.add_option("--mp", config.mp, "Tensor-slicing degree inside a node")->capture_default_str();
  app.add_option("--micro-batches", config.micro_batches, "l2l: micro-batches looped inside each layer (default 4)")
      ->capture_default_str();
}

Placement StrategyFlags::placement() const { return take(load_placement(strategy, place)); }

TrainingConfig StrategyFlags::training(const ModelSpec& model, const Placement& pl) const {
  TrainingConfig c = config;
  c.seq = model.seq;
  if (pl.layer_major && c.micro_batches == 1) c.micro_batches = 4;
  return take(validate(c, model.layers));
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

void write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::cout << text;
    return;
  }
  std::filesystem::path target(path);
  std::filesystem::path tmp = target;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw UsageError(path + ": cannot open for writing");
    out << text;
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp);
      throw UsageError(path + ": write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw UsageError(path + ": cannot write: " + ec.message());
  }
}

}  // namespace memwall::cli
