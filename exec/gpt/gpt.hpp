// A GPT on the Backend interface, in the style of llm.c's train_gpt2.c: token + position
// embeddings, pre-LN blocks (ln1, qkv, causal attention, proj, residual; ln2, fc1, GeLU, fc2,
// residual), ln_f and an LM head tied to the token embedding; fp32 on the device.
// Parameters are grouped and named as model/operator_graph.cpp names operators ("embed",
// "block3.qkv", "ln_f"), each group contiguous, so the ZeRO-3 engine can fetch/release a group.
// Activation checkpointing: with ci > 0 only the input of every ci-th block is kept; backward
// recomputes one segment of ci blocks at a time. Does not own the optimizer or the data.
// Thread-safety: one thread drives a Gpt (and its backend).
//
// Key: B batch, T sequence, C channels, NH heads, V vocabulary, L layers, BT = B*T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/backend/backend.hpp"
#include "model/result.hpp"

namespace memwall::exec {

struct GptConfig {
  int layers = 2;       // L
  int hidden = 128;     // C
  int heads = 4;        // NH
  int max_seq = 64;     // maxT: rows of the position embedding
  int vocab = 256;      // V: byte-level
};

// One tensor of the parameter array (torch's layout: Linear weights are (out, in)).
struct ParamTensor {
  std::string name;              // "block0.qkv.weight"
  std::vector<long> shape;       // (3C, C)
  std::size_t offset = 0;        // elements from the start of the parameter array
  std::size_t elems = 0;
};

// The parameters of one operator of the operator graph: contiguous [offset, offset + elems).
struct ParamGroup {
  std::string name;              // "embed", "block0.ln1", "block0.qkv", ..., "ln_f"
  std::size_t offset = 0;
  std::size_t elems = 0;
};

// Device bytes a Gpt of this shape allocates for (B, T) with checkpoint interval ci (0: none).
struct GptMemory {
  std::size_t params_bytes = 0, grads_bytes = 0, activations_bytes = 0, checkpoints_bytes = 0, scratch_bytes = 0;
  std::size_t total() const { return params_bytes + grads_bytes + activations_bytes + checkpoints_bytes + scratch_bytes; }
};
GptMemory gpt_memory(const GptConfig& cfg, int B, int T, int ci);

std::vector<ParamTensor> gpt_param_tensors(const GptConfig& cfg);
std::vector<ParamGroup> gpt_param_groups(const GptConfig& cfg);

// GPT-2's initialisation from a seed (normal(0, 0.02); residual projections / sqrt(2L); LayerNorm
// weight 1, biases 0), deterministic across platforms.
std::vector<float> gpt_init_params(const GptConfig& cfg, std::uint64_t seed);

class Gpt {
 public:
  // Allocates parameters, gradients, activations for exactly (B, T) on `backend`; fails (with the
  // backend's out-of-memory message) when they do not fit.
  static Result<std::unique_ptr<Gpt>> create(Backend& backend, const GptConfig& cfg, int B, int T, int ci);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptConfig& config() const { return cfg_; }
  int B() const { return B_; }
  int T() const { return T_; }
  int ci() const { return ci_; }
  std::size_t num_params() const { return num_params_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  Result<ParamGroup> group(const std::string& name) const;

  float* params() { return params_; }   // (num_params) device: every group, unless rebound
  float* grads() { return grads_; }     // (num_params) device: every group, unless rebound

  // Points one parameter group's weights and gradients at other device buffers of group.elems
  // floats (a ZeRO-3 engine's gathered buffer); nullptr restores the slot inside params()/grads().
  // Kernels read the bound buffers from the next call on; the caller keeps them alive and
  // resident while the group's operators run.
  Result<bool> bind_group(const std::string& name, float* weights, float* grads);
  int* tokens() { return tokens_; }     // (B, T) device inputs
  int* targets() { return targets_; }   // (B, T) device targets

  // Forward over tokens()/targets() already on the device; returns nothing until loss() syncs.
  void forward();
  float loss();                         // mean cross-entropy of the last forward (waits for it)
  const float* logits() const;          // (B, T, V) device, valid after forward() until backward()
  void zero_grad();
  void backward();                      // accumulates into grads()

 private:
  // One block's activations, all kept for its backward.
  struct BlockActs {
    float* ln1;       // (B, T, C)
    float* ln1_mean;  // (B, T)
    float* ln1_rstd;  // (B, T)
    float* qkv;       // (B, T, 3C)
    float* atty;      // (B, T, C)
    float* att;       // (B, NH, T, T)
    float* attproj;   // (B, T, C)
    float* res2;      // (B, T, C)
    float* ln2;       // (B, T, C)
    float* ln2_mean;  // (B, T)
    float* ln2_rstd;  // (B, T)
    float* fch;       // (B, T, 4C)
    float* fch_gelu;  // (B, T, 4C)
    float* fcproj;    // (B, T, C)
    float* res3;      // (B, T, C): the block's output
  };
  Gpt(Backend& b, const GptConfig& cfg, int B, int T, int ci) : be_(b), cfg_(cfg), B_(B), T_(T), ci_(ci) {}
  Result<bool> allocate();
  const float* P(std::size_t i) const { return group_params_[tensor_group_[i]] + tensor_in_group_[i]; }
  float* G(std::size_t i) { return group_grads_[tensor_group_[i]] + tensor_in_group_[i]; }
  std::size_t tensor_index(int layer, int which) const;
  const float* block_input(int layer) const;
  void block_forward(int layer);
  void block_backward(int layer, float* dx);
  void segment_forward(int seg, bool save_next);
  void linear_forward(float* out, const float* inp, std::size_t w, std::size_t b, int BT, int IC, int OC);
  void linear_backward(float* dinp, const float* dout, const float* inp, std::size_t w, std::size_t b, int BT, int IC,
                       int OC);

  Backend& be_;
  GptConfig cfg_;
  int B_, T_, ci_;       // ci_: blocks per segment (L when checkpointing is off)
  int segments_ = 1;
  std::size_t num_params_ = 0;
  std::vector<ParamTensor> tensors_;
  std::vector<ParamGroup> groups_;
  std::vector<std::size_t> tensor_group_;     // (tensors) index of each tensor's group
  std::vector<std::size_t> tensor_in_group_;  // (tensors) element offset inside its group
  std::vector<float*> group_params_;          // (groups) where each group's weights live now
  std::vector<float*> group_grads_;           // (groups) and its gradients
  std::vector<void*> allocations_;

  float* params_ = nullptr;
  float* grads_ = nullptr;
  int* tokens_ = nullptr;
  int* targets_ = nullptr;
  std::vector<float*> ckpt_;              // (segments) x (B, T, C): input of each segment's first block
  std::vector<BlockActs> ws_;             // (ci) per-block activations of the live segment
  float* lnf_ = nullptr;                  // (B, T, C)
  float* lnf_mean_ = nullptr;             // (B, T)
  float* lnf_rstd_ = nullptr;             // (B, T)
  float* logits_ = nullptr;               // (B, T, V); reused as dlogits in backward
  float* probs_ = nullptr;                // (B, T, V)
  float* losses_ = nullptr;               // (B, T)
  float* dx_ = nullptr;                   // (B, T, C) gradient of the residual stream
  float* dA_ = nullptr;                   // (B, T, C) scratch gradients
  float* dB_ = nullptr;                   // (B, T, 4C)
  float* dC_ = nullptr;                   // (B, T, 4C)
};

}  // namespace memwall::exec
