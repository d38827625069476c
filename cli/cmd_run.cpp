// `memwall run --config run.yaml`: trains a GPT on one rank with exec/gpt's Trainer and prints
// step, loss and tokens/s (with a progress bar on long runs). Parses and prints; exec/gpt trains.
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "exec/gpt/train.hpp"
#include "model/units.hpp"

namespace memwall::cli {
namespace {

struct RunFlags {
  std::string config;
};

std::string progress_bar(int step, int steps) {
  const int width = 20, filled = int(std::lround(double(width) * step / steps));
  return "[" + std::string(std::size_t(filled), '#') + std::string(std::size_t(width - filled), '.') + "] " +
         std::to_string(100 * step / steps) + " %";
}

}  // namespace

Command add_run(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "Train a GPT on one rank on a backend (cpu or cuda) from a run config: the byte-level corpus\n"
      "memwall ships, CPU Adam, activation checkpointing every ci blocks; prints step, loss, tokens/s");
  sub->add_option("--config", f->config,
                  "Run YAML: layers, hidden, heads, steps, bsz, seq, ci, lr, weight_decay, seed, backend, compute,\n"
                  "capacity (device memory, e.g. 256 MiB), corpus (default: exec/data/corpus.txt)")
      ->required();
  return {sub, [f]() {
            const exec::RunConfig cfg = take(exec::load_run_config(f->config));
            const exec::Corpus corpus = take(exec::Corpus::load(cfg.corpus));
            std::unique_ptr<exec::Trainer> trainer = take(exec::Trainer::create(cfg));
            exec::Backend& be = trainer->backend();
            const exec::GptConfig& m = cfg.model;
            std::cout << "memwall run: GPT " << m.layers << " layers, hidden " << m.hidden << ", " << m.heads
                      << " heads, " << format_count(double(trainer->model().num_params())) << " params; bsz "
                      << cfg.bsz << " x seq " << cfg.seq << ", ci " << cfg.ci << ", lr " << cfg.lr << ", seed "
                      << cfg.seed << "\n  backend " << be.caps().name << " (" << be.caps().device << ", "
                      << exec::compute_type_name(be.caps().compute) << "): "
                      << format_bytes(double(be.ops().used_bytes(be.ctx()))) << " used of "
                      << format_bytes(double(be.caps().capacity_bytes)) << "; corpus " << cfg.corpus << " ("
                      << format_bytes(double(corpus.bytes())) << ")\n\n";
            std::cout << "   step      loss   tokens/s\n";
            const bool long_run = cfg.steps > 50;
            const int every = long_run ? std::max(1, cfg.steps / 25) : 1;
            std::uint64_t rng = cfg.seed ^ 0x5eedba7c4ull;
            std::vector<int> tokens, targets;
            const double tokens_per_step = double(cfg.bsz) * cfg.seq;
            float first = 0, last = 0;
            double total_s = 0, window_s = 0;
            int window = 0;
            for (int s = 1; s <= cfg.steps; ++s) {
              corpus.next_batch(cfg.bsz, cfg.seq, rng, tokens, targets);
              const auto t0 = std::chrono::steady_clock::now();
              Result<float> loss = trainer->step(tokens, targets);
              if (!loss) {
                std::cerr << "memwall run: step " << s << ": " << loss.error() << "\n";
                return 1;
              }
              const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              total_s += dt, window_s += dt, ++window;
              if (s == 1) first = *loss;
              last = *loss;
              if (s == 1 || s % every == 0 || s == cfg.steps) {
                std::cout << std::setw(7) << s << std::setw(10) << std::fixed << std::setprecision(4) << *loss
                          << std::setw(11) << std::setprecision(0) << tokens_per_step * window / window_s;
                if (long_run) std::cout << "  " << progress_bar(s, cfg.steps);
                std::cout << std::endl;
                window = 0, window_s = 0;
              }
            }
            std::cout << std::defaultfloat << std::setprecision(6) << "\nloss " << first << " -> " << last
                      << " over " << cfg.steps << " steps; " << format_sig(tokens_per_step * cfg.steps / total_s)
                      << " tokens/s; " << format_sig(total_s) << " s\n";
            return 0;
          }};
}

}  // namespace memwall::cli
