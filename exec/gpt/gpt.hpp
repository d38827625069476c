// A decoder-only transformer as the operators of model/operator_graph.hpp, in the style of llm.c's
// train_gpt2.c. The paper's GPT by default: token and position embeddings, pre-LN blocks (ln1, qkv,
// attn_scores, attn_context, proj, residual1; ln2, fc1, gelu, fc2, residual2), ln_f and an LM head
// tied to the token embedding. The kinds of model/model_spec.hpp that change the block's arithmetic
// are the same operators computing otherwise: RMSNorm for LayerNorm, grouped key/value heads (the qkv
// projection makes NH query heads and KVH key/value heads, each shared by NH/KVH query heads),
// rotary positions (applied to q and k inside qkv, no position table), a gated feed-forward (fc1
// makes gate and up, C -> 2I; the activation is SiLU(gate) * up or GeLU(gate) * up), linear layers
// without biases, and an LM head with its own (V, C) weights. Every operator has a forward (also used
// to recompute a checkpointed block) and a backward entry point that is handed the fp32 weights of
// that operator (or of one tile of it, Sec. 5.1.3) and the fp32 buffer its parameter gradient
// accumulates into: whoever calls them (exec/engine, driven by the schedule) decides where parameters
// and gradients live. This file owns the activations: a workspace the caller provides, carved here
// into per-micro-batch buffers. It owns no parameters, no optimizer, no data. Thread-safety: one
// thread drives a GptOps (and its backend).
//
// Key: B batch (per micro-batch), T sequence, C channels, NH heads, KVH key/value heads, hs head size
// (C/NH unless given), A = NH*hs attention channels, I feed-forward size, V vocabulary, L layers,
// BT = B*T, QW = A + 2*KVH*hs (a qkv row).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/backend/backend.hpp"
#include "model/model_spec.hpp"
#include "model/training_config.hpp"
#include "model/operator_graph.hpp"
#include "model/result.hpp"

namespace memwall::exec {

struct GptConfig {
  int layers = 2;       // L
  int hidden = 128;     // C
  int heads = 4;        // NH
  int max_seq = 64;     // maxT: rows of the position embedding
  int vocab = 256;      // V: byte-level
  // The block's kind: ModelSpec's fields of the same names (model/model_spec.hpp); the defaults are
  // the paper's GPT.
  int kv_heads = 0;     // KVH; 0: heads
  int head_size = 0;    // hs; 0: C / NH (Mistral NeMo: 128 where C / NH = 160)
  FfnKind ffn = FfnKind::gelu;
  int intermediate = 0; // I; 0: 4C
  NormKind norm = NormKind::layernorm;
  PositionKind positions = PositionKind::learned;
  bool tied_embeddings = true;
  BiasKind bias = BiasKind::all;
  double rope_theta = 10000;  // rotary: the base of the frequencies, theta^(-2i/hs) (Llama 3: 500000)
  // Tensor slicing (Megatron-LM): this config is rank mp_rank's slice of a model mp times as wide
  // (mp_slice): heads, key/value heads and the feed-forward size are its own; the embeddings, norms
  // and the row-parallel layers' (proj, fc2) biases whole.
  int mp = 1;
  int mp_rank = 0;
int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int ffn_size() const { return intermediate > 0 ? intermediate : 4 * hidden; }
  bool gated() const { return ffn != FfnKind::gelu; }
  int head_dim() const { return head_size > 0 ? head_size : hidden / heads; }
  int attention_width() const { return heads * head_dim(); }               // A: q and the context
  int qkv_width() const { return attention_width() + 2 * kv() * head_dim(); }  // QW
};

// The executor's config of a model (max_seq = its seq) and back: the one translation between them.
GptConfig gpt_config(const ModelSpec& m);
// Rank `rank`'s slice of `whole` under tensor slicing over `mp` ranks (Megatron-LM): heads
// r*NH/mp .. (r+1)*NH/mp of q, the same share of the key/value heads, columns r*I/mp .. of fc1 (of
// its gate and of its up projection when gated) and the matching input columns of proj and fc2.
// mp 1: `whole`. check_mp_slicing says whether `whole` splits.
GptConfig mp_slice(const GptConfig& whole, int mp, int rank);
Result<bool> check_mp_slicing(const GptConfig& whole, int mp);
// Whether the executor trains `m`: a mixture of experts and sliding-window attention are refused
// with the reason (memwall plans and simulates them), as are shapes its kernels do not take (a
// head size that is odd with rotary positions, a vocabulary other than the byte-level 256).
Result<bool> executor_trains(const ModelSpec& m);

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
  bool linear = false;           // weight (OC, IC) then bias (OC) if any: may be tiled by output rows
  bool bias = false;             // a linear group's bias, a norm's shift (LayerNorm's, not RMSNorm's)
  bool row_parallel = false;     // proj, fc2: Megatron's row-parallel (input features sliced, bias whole)
  long in_features = 0, out_features = 0;
};

// The operator graph's description of this GPT (seq = max_seq): what its schedule is built from.
ModelSpec gpt_model_spec(const GptConfig& cfg);

std::vector<ParamTensor> gpt_param_tensors(const GptConfig& cfg);
std::vector<ParamGroup> gpt_param_groups(const GptConfig& cfg);

// GPT-2's initialisation from a seed (normal(0, 0.02); residual projections / sqrt(2L); LayerNorm
// weight 1, biases 0), counter-based: element i of tensor t is a function of (seed, t's name, i)
// alone, the same on every platform. Any range of any group is made on its own, so each
// data-parallel rank initialises only its shard (Sec. 7.2) and the assembled weights do not depend
// on how they were split. gpt_init_group fills elements [from, from + count) of group g in its
// tile-major order (tiles 1: the parameter array's order); gpt_init_params makes the whole array.
// A slice (cfg.mp > 1) takes each element's value from the whole model's tensor at the element it
// slices, so mp ranks together start from the one-rank run's weights.
void gpt_init_group(const GptConfig& cfg, std::uint64_t seed, const ParamGroup& g, int tiles, std::size_t from,
                    std::size_t count, float* out);
std::vector<float> gpt_init_params(const GptConfig& cfg, std::uint64_t seed);
// A slice's parameter array (cfg.mp > 1) in the whole model's: for each of its elements, the index
// of the whole parameter array's element it is (the one gpt_init_group takes its value from).
std::vector<std::size_t> gpt_slice_indices(const GptConfig& slice);

// A linear group tiled by output rows keeps tile t's weight rows and bias entries together, so
// one tile is one contiguous range: [W_t (OC/tiles, IC), b_t (OC/tiles)] for t = 0 .. tiles-1
// (without a bias, [W_t]).
// These move a group between the parameter array's order and that one (tiles 1: identity).
void to_tile_major(const ParamGroup& g, int tiles, const float* in, float* out);
void from_tile_major(const ParamGroup& g, int tiles, const float* in, float* out);

// The operators are the operator graph's (model/operator_graph.hpp's roles); a schedule names one
// by role and block.
using OpKind = memwall::OpRole;
struct OpRef {
  OpKind kind = OpKind::embed;
  int block = -1;
};
// The parameter group an operator uses (a tied LM head: the embedding's), by its index in
// gpt_param_groups, or -1 for an operator without parameters.
int param_group_of(const GptConfig& cfg, OpKind kind, int block);

// One call of an operator. `params` / `grads` point at the operator's (tile's) parameters in the
// group layout above (tile-major), fp32 on the device; nullptr for operators without parameters.
struct OpCall {
  OpRef op;
  int tile = -1;         // -1: untiled; else 0 .. tiles-1
  int tiles = 1;
  int micro_batch = 0;
  bool recompute = false;  // forward of a checkpointed block in backward: reads the segment's input
  const float* params = nullptr;
  float* grads = nullptr;  // backward accumulates (+=) into it
};

class GptOps {
 public:
  // Bytes of the workspace for micro-batches of (B, T), checkpoint interval ci (blocks per
  // segment), and fp32 staging for the largest operator's (tile's) parameters and gradients.
  // 256-byte aligned pieces. l2l's `micro_batches` each keep their tokens, residual stream, head
  // and gradient stream; they share one segment's activations and the backward scratch, since the
  // schedule runs one micro-batch through a block (or a segment) at a time (seed 002, Sec. 2.2).
  // `pipeline_chunks` (a pipeline stage's chunks of blocks; 0 without stages): four (B, T, C) buffers
  // more per chunk, its input and output activations and their gradients (set_stage).
  static std::size_t workspace_bytes(const GptConfig& cfg, int B, int T, int ci, int micro_batches, int tiles,
                                     int pipeline_chunks = 0);
  // Carves `workspace` (device memory of workspace_bytes(...), owned by the caller, alive as long
  // as this object) into activation buffers.
  static Result<std::unique_ptr<GptOps>> create(Backend& backend, const GptConfig& cfg, int B, int T, int ci,
                                                int micro_batches, int tiles, void* workspace, std::size_t bytes,
                                                int pipeline_chunks = 0);

  // A pipeline stage computes its chunks of blocks, each [first, last) (one chunk, or interleaved
  // 1F1B's v: stage_chunks), the embedding before block 0, ln_f and the head after the last. A
  // chunk's first block reads its forward input from stage_input(k) (what the stage before sent),
  // its last block writes its output to stage_output(k) (what goes to the stage after); in backward
  // a chunk starts from stage_grad_input(k) (the next chunk's input gradient: take_stage_grad
  // copies it into the gradient stream) and leaves its own input gradient in stage_grad_output(k)
  // (give_stage_grad). Checkpoint segments start at a chunk's first block. At most the
  // pipeline_chunks the workspace was carved for.
  void set_stage(std::vector<StageBlocks> chunks) { chunks_ = std::move(chunks); }
  const std::vector<StageBlocks>& chunks() const { return chunks_; }
  // The chunk holding block b (0 when no stage was set).
  int chunk_of(int b) const;
  float* stage_input(int k) { return io_[4 * std::size_t(k)]; }
  float* stage_output(int k) { return io_[4 * std::size_t(k) + 1]; }
  float* stage_grad_input(int k) { return io_[4 * std::size_t(k) + 2]; }
  float* stage_grad_output(int k) { return io_[4 * std::size_t(k) + 3]; }
  void take_stage_grad(int u, int k);  // the gradient stream of micro-batch u := stage_grad_input(k)
  void give_stage_grad(int u, int k);  // stage_grad_output(k) := the gradient stream of micro-batch u

  const GptConfig& config() const { return cfg_; }
  int B() const { return B_; }
  int T() const { return T_; }
  // Elements of one (B, T, C) activation: what a pipeline message, a tensor-slicing all-reduce
  // and a stage buffer hold (fp32).
  std::size_t stream_elems() const { return std::size_t(B_) * std::size_t(T_) * std::size_t(cfg_.hidden); }
  void forward(const OpCall& c);
  void backward(const OpCall& c);
  // The loss is the mean over every position of every micro-batch of `micro_steps` accumulated
  // micro-steps of `ranks` data-parallel ranks: each backward scales its gradients so the sum over
  // ranks and micro-steps is the gradient of that mean.
  void set_data_parallel(int ranks, int micro_steps = 1) {
    ranks_ = ranks;
    micro_steps_ = micro_steps;
  }

  // Tensor slicing's all-reduce over the mp ranks (the schedule's allreduce steps of hop mp): the
  // (B, T, C) partial sums the slice's operator `kind` of block `block` left for micro-batch u:
  // proj's and fc2's outputs in forward (and recompute), qkv's and fc1's input gradients in backward.
  float* mp_partial_sums(OpKind kind, int block, bool backward, int u);

  int* tokens(int u) { return mb_[std::size_t(u)].tokens; }    // (B, T) device inputs of micro-batch u
  int* targets(int u) { return mb_[std::size_t(u)].targets; }  // (B, T) device targets
  // The input of block b in forward: what a checkpoint saved at b copies (B, T, C).
  const float* block_input(int b, int u) const;
  // Where a loaded checkpoint of block b (a segment's first block) lives for its recompute.
  void set_segment_input(int u, const float* x) { mb_[std::size_t(u)].segment_input = x; }
  const float* losses(int u) const { return mb_[std::size_t(u)].losses; }  // (B, T) after lm_head forward
  const float* logits(int u) const { return mb_[std::size_t(u)].logits; }  // (B, T, V) after lm_head forward
  // fp32 staging the caller may use to widen 16-bit parameters and gradients of one call.
  float* weight_staging() { return weight_staging_; }
  float* grad_staging() { return grad_staging_; }
  std::size_t staging_elems() const { return staging_elems_; }

 private:
  // One block's activations, all kept for its backward.
  struct BlockActs {
    float* ln1;       // (B, T, C)
    float* ln1_mean;  // (B, T) (LayerNorm only)
    float* ln1_rstd;  // (B, T)
    float* qkv;       // (B, T, QW), q and k rotated when positions are rotary
    float* att;       // (B, NH, T, T)
    float* atty;      // (B, T, A)
    float* attproj;   // (B, T, C)
    float* res2;      // (B, T, C)
    float* ln2;       // (B, T, C)
    float* ln2_mean;  // (B, T)
    float* ln2_rstd;  // (B, T)
    float* fch;       // (B, T, I), gated: (B, T, 2I), the gate then the up projection
    float* fch_gelu;  // (B, T, I)
    float* fcproj;    // (B, T, C)
    float* res3;      // (B, T, C): the block's output in recompute
  };
  struct MicroBatch {
    int* tokens;                 // (B, T)
    int* targets;                // (B, T)
    float* stream[2];            // (B, T, C) forward residual stream: block b reads stream[b % 2]
    std::vector<BlockActs> ws;   // (ci) the live segment's blocks
    const float* segment_input;  // recompute: the loaded checkpoint of the segment's first block
    float* lnf;                  // (B, T, C)
    float* lnf_mean;             // (B, T)
    float* lnf_rstd;             // (B, T)
    float* logits;               // (B, T, V)
    float* probs;                // (B, T, V)
    float* dlogits;              // (B, T, V)
    float* losses;               // (B, T)
    float* dx;                   // (B, T, C) gradient of the residual stream
    float* dA;                   // (B, T, max(C, A)) scratch gradients
    float* dB;                   // d(fch_gelu) (B, T, I), also d(qkv) (B, T, QW)
    float* dC;                   // d(fch) (B, T, I or 2I)
    float* datt;                 // (B, NH, T, T)
  };
  struct Layout;  // sizes and carving, shared by workspace_bytes and create

  GptOps(Backend& b, const GptConfig& cfg, int B, int T, int ci, int mbs)
      : be_(b), cfg_(cfg), B_(B), T_(T), ci_(ci), micro_batches_(mbs) {}
  BlockActs& acts(int block, int u) { return mb_[std::size_t(u)].ws[std::size_t((block - first_of(block)) % ci_)]; }
  // The first block of block b's chunk, and the end of it (the whole model without stages).
  int first_of(int b) const { return chunks_.empty() ? 0 : chunks_[std::size_t(chunk_of(b))].first; }
  int last_of(int b) const { return chunks_.empty() ? cfg_.layers : chunks_[std::size_t(chunk_of(b))].last; }
  bool staged() const { return !io_.empty() && !chunks_.empty(); }
  const float* block_in(int block, int u, bool recompute) const;
  float* block_out(int block, int u, bool recompute);
  void linear_forward(const OpCall& c, float* out, const float* inp, long IC, long OC);
  void linear_backward(const OpCall& c, float* dinp, const float* dout, const float* inp, long IC, long OC);
  void norm_forward(const OpCall& c, float* out, float* mean, float* rstd, const float* inp);
  void norm_backward(const OpCall& c, float* dinp, const float* dout, const float* inp, const float* mean,
                     const float* rstd);
  bool has_bias(const OpCall& c) const;

  Backend& be_;
  GptConfig cfg_;
  int B_, T_, ci_, micro_batches_;
  int ranks_ = 1;
  int micro_steps_ = 1;
  std::vector<StageBlocks> chunks_;  // this pipeline stage's blocks, chunk by chunk (none: every block)
  std::vector<float*> io_;           // per chunk: input, output, input gradient, output gradient
  std::vector<MicroBatch> mb_;
  std::vector<bool> role_bias_;  // by OpRole: whether that linear operator has a bias
  float* weight_staging_ = nullptr;
  float* grad_staging_ = nullptr;
  std::size_t staging_elems_ = 0;
};

}  // namespace memwall::exec
