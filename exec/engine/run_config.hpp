// What `memwall run` trains and how: the run configuration (YAML, validated with file:line:field
// errors: model shape, steps, batch, learning rate, seed, backend, precision, device capacity,
// corpus) and the byte-level corpus batches are drawn from. Where states live and how an iteration
// is scheduled come from a placement and a training config (flags or a plan), not from here.
// Value types; Corpus is immutable after load and safe to share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/adam/adam_types.hpp"
#include "exec/adam/lr_schedule.hpp"
#include "exec/backend/backend.hpp"
#include "exec/gpt/gpt.hpp"
#include "model/result.hpp"

namespace memwall::exec {

// Upper bounds of a run config: lr and weight_decay (a larger rate only trains to NaN) and the
// corpus (read into memory whole).
inline constexpr double kMaxRate = 10;
inline constexpr std::size_t kMaxCorpusBytes = std::size_t(1) << 30;

struct RunConfig {
  // layers, hidden, heads (max_seq = seq, vocab 256) and the block's kind: kv_heads, ffn,
  // intermediate, norm, positions, tied_embeddings, bias as in a model YAML, rope_theta
  GptConfig model;
  int steps = 300;
  int bsz = 8;                       // sequences per step
  int seq = 64;                      // tokens per sequence
  int ci = 0;                        // checkpoint interval in blocks; 0 = keep every activation
  double lr = 1e-3;                  // Adam (the peak, with a schedule)
  // lr_schedule (constant, linear, cosine), warmup_steps, decay_steps (0: the run's steps), min_lr
  adam::LrSchedule lr_schedule;
  double weight_decay = 0.0;         // AdamW's decoupled decay
  double grad_clip = 0.0;            // the largest global gradient L2 norm (clip_grad_norm_); 0 = no clipping
std::uint64_t seed = 1337;         // initial weights and batch order
  std::string backend = "cpu";
  ComputeType compute = ComputeType::fp32;
  // What param16 and grad16 are stored as: bf16 / fp16 (mixed precision, the paper's) or fp32 (for
  // comparison with PyTorch in fp32). Master parameters and Adam's moments are always fp32.
  adam::DType precision = adam::DType::bf16;
  std::size_t capacity_bytes = 0;    // device memory limit; 0 = the profile's GPU memory
  std::string corpus;                // byte-level text file; empty = the one memwall ships (built in)
};

// Parses a run YAML. Unknown keys, bad values and a missing corpus are errors naming file:line:field.
// Relative corpus paths are taken from the config file's folder.
Result<RunConfig> parse_run_config(const std::string& source, std::string_view text);
Result<RunConfig> load_run_config(const std::string& path);
// The corpus memwall ships (exec/data/corpus.txt), compiled into the program so a run needs no
// file from the source tree (a relocated bundle has none).
extern const std::string_view kShippedCorpus;

// Reads a corpus (at least seq + 1 bytes) and draws batches of (B, T) inputs and next-byte targets
// at offsets from a seeded generator: the same seed gives the same batches.
class Corpus {
 public:
  static Result<Corpus> load(const std::string& path);  // "" = kShippedCorpus
  std::size_t bytes() const { return data_.size(); }
  void next_batch(int B, int T, std::uint64_t& rng, std::vector<int>& tokens, std::vector<int>& targets) const;

 private:
  std::vector<unsigned char> data_;
};

}  // namespace memwall::exec
