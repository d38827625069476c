// Training a Gpt on one rank: the run configuration (YAML, validated with file:line:field errors),
// the byte-level corpus and the step loop (forward and backward on the backend, gradients copied
// to the host on a copy stream with an event, CPU Adam on fp32 master parameters, parameters
// copied back): ZeRO-Offload's shape on one rank, which the ZeRO-3 engine will split by group.
// Does not print: callers (memwall run, tests) get each step's numbers and show them.
// Thread-safety: one thread drives a Trainer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/backend.hpp"
#include "exec/gpt/gpt.hpp"
#include "model/result.hpp"

namespace memwall::exec {

struct RunConfig {
  GptConfig model;                   // layers, hidden, heads (max_seq = seq, vocab 256)
  int steps = 300;
  int bsz = 8;                       // sequences per step
  int seq = 64;                      // tokens per sequence
  int ci = 0;                        // checkpoint interval in blocks; 0 = keep every activation
  double lr = 1e-3;                  // Adam
  double weight_decay = 0.0;         // AdamW's decoupled decay
  std::uint64_t seed = 1337;         // initial weights and batch order
  std::string backend = "cpu";
  ComputeType compute = ComputeType::fp32;
  std::size_t capacity_bytes = 0;    // device memory limit; 0 = the backend's default
  std::string corpus;                // byte-level text file; empty = the one memwall ships
};

// Parses a run YAML. Unknown keys, bad values and a missing corpus are errors naming file:line:field.
// Relative corpus paths are taken from the config file's folder.
Result<RunConfig> parse_run_config(const std::string& source, std::string_view text);
Result<RunConfig> load_run_config(const std::string& path);
std::string default_corpus_path();

// Reads a corpus (at least seq + 1 bytes) and draws batches of (B, T) inputs and next-byte targets
// at offsets from a seeded generator: the same seed gives the same batches.
class Corpus {
 public:
  static Result<Corpus> load(const std::string& path);
  std::size_t bytes() const { return data_.size(); }
  void next_batch(int B, int T, std::uint64_t& rng, std::vector<int>& tokens, std::vector<int>& targets) const;

 private:
  std::vector<unsigned char> data_;
};

struct StepResult {
  int step = 0;          // 1-based
  float loss = 0;        // before this step's update
  double step_s = 0;
  double tokens_per_s = 0;
};

class Trainer {
 public:
  // Refuses a config whose device memory (GptMemory) exceeds the backend's capacity, before any
  // allocation, naming bytes needed and available.
  static Result<std::unique_ptr<Trainer>> create(const RunConfig& cfg);

  Backend& backend() { return *backend_; }
  Gpt& model() { return *gpt_; }
  std::vector<float>& master_params() { return master_; }  // host fp32; upload_params() after editing
  void upload_params();

  // One step on host tokens/targets (B*T each): forward, backward, Adam. Returns the loss.
  Result<float> step(const std::vector<int>& tokens, const std::vector<int>& targets);
  // Gradients of the last step as they reached the host (before Adam consumed them).
  const std::vector<float>& host_grads() const { return grads_; }

  ~Trainer();

 private:
  Trainer() = default;
  RunConfig cfg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Gpt> gpt_;
  std::unique_ptr<adam::CpuAdam> adam_;
  Stream copy_ = 0;
  Event ev_ready_ = nullptr, ev_grads_ = nullptr;
  std::vector<float> master_, m_, v_, grads_;
  std::vector<int> tokens_, targets_;  // host staging of the batch being uploaded
  long step_ = 0;
};

// Device bytes a run needs and the refusal message if the capacity is smaller.
std::string memory_shortfall(const RunConfig& cfg, const GptMemory& need, std::size_t capacity_bytes);

}  // namespace memwall::exec
