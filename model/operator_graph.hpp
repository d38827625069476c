// OperatorGraph: a decoder-only transformer (the paper's GPT, or a ModelSpec with GQA, gated
// feed-forward, RMSNorm, untied head, experts) as operators with data dependencies (Boost.Graph).
// Each operator knows its forward, backward and recompute FLOPs, the parameters it owns (or, for
// the tied LM head, whose parameters it uses: the paper's "external parameter", Sec. 7.1.1) and
// the activation bytes it reads and writes, for a given micro-batch and sequence. Owns no
// placement or schedule. Immutable after construction; safe to share between threads.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include <boost/graph/adjacency_list.hpp>

#include "model/model_spec.hpp"

namespace memwall {

enum class OpKind { embedding, layernorm, linear, attention_scores, attention_context, gelu, residual_add, lm_head };
const char* to_string(OpKind k);
// Which operator of the GPT it is: an executor picks its kernel by role and block, never by name.
// A gated feed-forward's fc1 makes the gate and the up projection together and `gelu` is its
// activation (SiLU or GeLU times the up half); `router` is a mixture of experts' gate (C -> experts).
enum class OpRole { embed, ln1, qkv, attn_scores, attn_context, proj, residual1, ln2, fc1, gelu, fc2, residual2, ln_f,
                    lm_head, router };
const char* to_string(OpRole r);  // "ln1", "fc2", "lm_head", ...
std::string op_name(OpRole role, int block);  // "block3.fc1"; "embed", "ln_f", "lm_head" outside blocks

// Shapes use the llm.c key: B micro-batch, T sequence, C hidden, NH heads, V vocabulary.
struct Operator {
  std::string name;        // "block3.fc1", "embed", "lm_head"
  OpKind kind = OpKind::linear;
  int block = -1;          // transformer block, -1 outside blocks
  OpRole role = OpRole::embed;
  long in_features = 0;    // linear layers only: (C -> 3C) for qkv, ...
  long out_features = 0;
  double param_elems = 0;  // parameters this operator owns (weights + biases)
  double weight_elems = 0; // the linear-layer weights among them (what Eq. 1 counts)
  double active_elems = 0; // of param_elems, those a token passes through (all but unrouted experts)
  int copies = 1;          // experts stored (a mixture of experts' fc1, fc2): one parameter unit each
  std::string param_owner{};  // operator whose parameters it uses: itself, or "embed" for lm_head
  double fwd_flops = 0;
  double bwd_flops = 0;
  double recompute_flops = 0;  // forward again in backward (operators inside checkpointed blocks)
  double act_read_bytes = 0;   // fp16 activations read in forward
  double act_write_bytes = 0;  // fp16 activations written in forward
};

// A block's operators that own parameters, in forward order, before tensor slicing: the one place
// the graph, the memory model and the schedule's parameter units (model/memory.hpp) take them from.
struct BlockParamOp {
  OpRole role = OpRole::ln1;
  bool linear = false;   // sliced by mp and tiled; norms are replicated
  long in = 0, out = 0;  // a linear layer's features, one expert's
  int copies = 1;        // experts stored (routed + shared); 1 for a dense layer
  int active = 1;        // copies each token passes through
  double bias = 0;       // bias elements of one copy
  double elems = 0;      // every parameter: copies x (in x out + bias), or a norm's
};
// At most 7 (ln1, qkv, proj, ln2, router, fc1, fc2), held in place: the planner asks for them in
// its inner loops (estimate_time, the memory model), where a heap vector per call was a sixth of
// `memwall plan`'s time.
class BlockParamOps {
 public:
  static constexpr std::size_t kMax = 7;
  void push_back(const BlockParamOp& op);  // throws std::logic_error past kMax
  const BlockParamOp* begin() const { return ops_.data(); }
  const BlockParamOp* end() const { return ops_.data() + n_; }
  std::size_t size() const { return n_; }
  const BlockParamOp& operator[](std::size_t i) const { return ops_[i]; }

 private:
  std::array<BlockParamOp, kMax> ops_{};
  std::size_t n_ = 0;
};
BlockParamOps block_param_ops(const ModelSpec& m);
double norm_param_elems(const ModelSpec& m);   // 2C LayerNorm, C RMSNorm
double embed_param_elems(const ModelSpec& m, long seq);  // (V + T) x C learned, V x C rotary
double head_param_elems(const ModelSpec& m);   // V x C untied, 0 tied (the embedding's)
// Linear weights a token passes through in one block (the active experts only): Eq. 1's 12·hd²
// per layer for the paper's GPT.
double active_block_weight_elems(const ModelSpec& m);
// Share of the (T, T) score blocks attention computes: block-sparse density (seed 004) times a
// sliding window's keys per query over the sequence.
double attention_share(const ModelSpec& m, long seq, double attention_density);

using OpGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Operator>;

struct OperatorGraph {
  OpGraph graph;
  std::vector<size_t> order;  // forward execution order (a topological order of `graph`)

  const Operator& op(size_t v) const { return graph[v]; }
  size_t size() const { return boost::num_vertices(graph); }

  // FLOPs of one iteration: linear layers (what Eq. 7-8 counts) and the rest (attention score
  // and context products, LM head, elementwise), forward + backward + recompute.
  double linear_flops() const;
  double other_flops() const;
  double attention_flops() const;
  double linear_weight_elems() const;  // the blocks' linear weights, every expert: Eq. 1's 12·nl·hd²
  double param_elems() const;          // every parameter, embeddings and biases included
  // Parameters a token passes through: every parameter less the experts it is not routed to.
  double active_param_elems() const;
};

// Bytes per activation element the graph counts (fp16); a schedule built with other MemorySizes
// scales act_read_bytes / act_write_bytes by its act_bytes / kGraphActBytes.
inline constexpr double kGraphActBytes = 2.0;

// Builds the graph for micro-batch `bsz` and sequence `seq`; activations are fp16 (2 bytes).
// `attention_density` in (0, 1]: block-sparse attention (seed 004) computes that share of the
// (T, T) score blocks: the score and context operators' FLOPs and score bytes scale by it; every
// other operator is the dense one.
OperatorGraph build_gpt_graph(const ModelSpec& model, double bsz, long seq, double attention_density = 1);

// The GEMM of a linear operator's forward, (M, K) x (K, N): M tokens (micro-batch x sequence; an
// expert's share of them, tokens x active / experts, in a mixture of experts), K
// its input features, N its outputs, on one tensor slice (column-parallel qkv and fc1 split N by
// mp, row-parallel proj and fc2 split K) and one tile (tiling splits N). Backward's two GEMMs have
// the same three sizes in other orders. What calibrate measures a rate for and the simulator looks
// it up by (HardwareProfile::gemm_rate). {0, 0, 0} for an operator that is not a linear layer.
struct GemmShape {
  long m = 0, n = 0, k = 0;
};
GemmShape linear_gemm_shape(const ModelSpec& m, OpRole role, long tokens, int mp = 1, int tiles = 1);

}  // namespace memwall
