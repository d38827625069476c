#include "model/operator_graph.hpp"

#include <algorithm>
#include <boost/graph/topological_sort.hpp>
#include <iterator>
#include <stdexcept>

namespace memwall {

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::embedding: return "embedding";
    case OpKind::layernorm: return "layernorm";
    case OpKind::linear: return "linear";
    case OpKind::attention_scores: return "attention_scores";
    case OpKind::attention_context: return "attention_context";
    case OpKind::gelu: return "gelu";
    case OpKind::residual_add: return "residual_add";
    case OpKind::lm_head: return "lm_head";
  }
  return "?";
}

const char* to_string(OpRole r) {
  switch (r) {
    case OpRole::embed: return "embed";
    case OpRole::ln1: return "ln1";
    case OpRole::qkv: return "qkv";
    case OpRole::attn_scores: return "attn_scores";
    case OpRole::attn_context: return "attn_context";
    case OpRole::proj: return "proj";
    case OpRole::residual1: return "residual1";
    case OpRole::ln2: return "ln2";
    case OpRole::fc1: return "fc1";
    case OpRole::gelu: return "gelu";
    case OpRole::fc2: return "fc2";
    case OpRole::residual2: return "residual2";
    case OpRole::ln_f: return "ln_f";
    case OpRole::lm_head: return "lm_head";
  }
  return "?";
}

std::string op_name(OpRole role, int block) {
  return block >= 0 ? "block" + std::to_string(block) + "." + to_string(role) : to_string(role);
}

namespace {

constexpr double kAct = kGraphActBytes;  // bytes per fp16 activation element

class Builder {
 public:
  Builder(const ModelSpec& m, double bsz, long seq, double density)
      : m_(m), tokens_(bsz * double(seq)), bsz_(bsz), seq_(seq), density_(density) {}

  size_t add(Operator op, std::initializer_list<size_t> inputs) {
    if (op.param_owner.empty() && op.param_elems > 0) op.param_owner = op.name;
    size_t v = boost::add_vertex(op, g_);
    for (size_t in : inputs) boost::add_edge(in, v, g_);
    return v;
  }

  Operator linear(OpRole role, int block, long in, long out) {
    Operator op{op_name(role, block), OpKind::linear, block, role, in, out};
    op.weight_elems = double(in) * double(out);
    op.param_elems = op.weight_elems + double(out);
    op.fwd_flops = 2.0 * tokens_ * double(in) * double(out);
    op.bwd_flops = 2.0 * op.fwd_flops;  // input gradient and weight gradient
    op.act_read_bytes = kAct * tokens_ * double(in);
    op.act_write_bytes = kAct * tokens_ * double(out);
    return op;
  }

  // Elementwise operators: FLOPs are small approximate counts per element (LayerNorm ~8, GeLU ~8,
  // add 1); they matter only to show what Eq. 7 leaves out.
  Operator elementwise(OpRole role, OpKind kind, int block, double elems, double flops_per_elem,
                       double param_elems, int inputs) {
    Operator op{op_name(role, block), kind, block, role};
    op.param_elems = param_elems;
    op.fwd_flops = flops_per_elem * elems;
    op.bwd_flops = 2.0 * op.fwd_flops;
    op.act_read_bytes = kAct * elems * inputs;
    op.act_write_bytes = kAct * elems;
    return op;
  }

  OperatorGraph build() {
    const long C = m_.hidden;
    const double TC = tokens_ * double(C);
    Operator embed{"embed", OpKind::embedding, -1, OpRole::embed};
    embed.param_elems = double(m_.vocab) * C + double(seq_) * C;  // token (V, C) + position (T, C)
    embed.act_write_bytes = kAct * TC;
    size_t x = add(embed, {});
    for (int b = 0; b < m_.layers; ++b) {
      size_t ln1 = add(elementwise(OpRole::ln1, OpKind::layernorm, b, TC, 8, 2.0 * C, 1), {x});
      size_t qkv = add(linear(OpRole::qkv, b, C, 3 * C), {ln1});
      // (B, NH, T, T) = (B, NH, T, C/NH) x (B, NH, C/NH, T): 2·B·T²·C FLOPs, and the same for context;
      // block-sparse attention computes and stores only `density_` of the (T, T) blocks.
      Operator scores{op_name(OpRole::attn_scores, b), OpKind::attention_scores, b, OpRole::attn_scores};
      scores.fwd_flops = 2.0 * bsz_ * double(seq_) * double(seq_) * C * density_;
      scores.bwd_flops = 2.0 * scores.fwd_flops;
      scores.act_read_bytes = kAct * 2 * TC;
      scores.act_write_bytes = kAct * bsz_ * m_.heads * double(seq_) * double(seq_) * density_;
      size_t sc = add(scores, {qkv});
      Operator context{op_name(OpRole::attn_context, b), OpKind::attention_context, b, OpRole::attn_context};
      context.fwd_flops = scores.fwd_flops;
      context.bwd_flops = scores.bwd_flops;
      context.act_read_bytes = scores.act_write_bytes + kAct * TC;
      context.act_write_bytes = kAct * TC;
      size_t ctx = add(context, {sc, qkv});
      size_t proj = add(linear(OpRole::proj, b, C, C), {ctx});
      size_t res1 = add(elementwise(OpRole::residual1, OpKind::residual_add, b, TC, 1, 0, 2), {x, proj});
      size_t ln2 = add(elementwise(OpRole::ln2, OpKind::layernorm, b, TC, 8, 2.0 * C, 1), {res1});
      size_t fc1 = add(linear(OpRole::fc1, b, C, 4 * C), {ln2});
      size_t gelu = add(elementwise(OpRole::gelu, OpKind::gelu, b, 4 * TC, 8, 0, 1), {fc1});
      size_t fc2 = add(linear(OpRole::fc2, b, 4 * C, C), {gelu});
      x = add(elementwise(OpRole::residual2, OpKind::residual_add, b, TC, 1, 0, 2), {res1, fc2});
    }
    size_t lnf = add(elementwise(OpRole::ln_f, OpKind::layernorm, -1, TC, 8, 2.0 * C, 1), {x});
    Operator head{"lm_head", OpKind::lm_head, -1, OpRole::lm_head, C, m_.vocab};
    head.param_owner = "embed";  // tied to the token embedding: an external parameter
    head.fwd_flops = 2.0 * tokens_ * double(C) * double(m_.vocab);
    head.bwd_flops = 2.0 * head.fwd_flops;
    head.act_read_bytes = kAct * TC;
    head.act_write_bytes = kAct * tokens_ * double(m_.vocab);
    add(head, {lnf});

    // Blocks are checkpointed: their forward runs again in backward (Eq. 7's extra forward).
    for (auto v : boost::make_iterator_range(boost::vertices(g_)))
      if (g_[v].block >= 0) g_[v].recompute_flops = g_[v].fwd_flops;

    OperatorGraph out;
    out.graph = g_;
    std::vector<size_t> reversed;
    boost::topological_sort(out.graph, std::back_inserter(reversed));
    out.order.assign(reversed.rbegin(), reversed.rend());
    return out;
  }

 private:
  const ModelSpec& m_;
  double tokens_;
  double bsz_;
  long seq_;
  double density_;
  OpGraph g_;
};

template <typename F>
double sum_ops(const OperatorGraph& g, F f) {
  double s = 0;
  for (size_t v : g.order) s += f(g.op(v));
  return s;
}

}  // namespace

double OperatorGraph::linear_flops() const {
  return sum_ops(*this, [](const Operator& o) {
    return o.kind == OpKind::linear ? o.fwd_flops + o.bwd_flops + o.recompute_flops : 0.0;
  });
}
double OperatorGraph::other_flops() const {
  return sum_ops(*this, [](const Operator& o) {
    return o.kind != OpKind::linear ? o.fwd_flops + o.bwd_flops + o.recompute_flops : 0.0;
  });
}
double OperatorGraph::attention_flops() const {
  return sum_ops(*this, [](const Operator& o) {
    bool attn = o.kind == OpKind::attention_scores || o.kind == OpKind::attention_context;
    return attn ? o.fwd_flops + o.bwd_flops + o.recompute_flops : 0.0;
  });
}
double OperatorGraph::linear_weight_elems() const {
  return sum_ops(*this, [](const Operator& o) { return o.weight_elems; });
}
double OperatorGraph::param_elems() const {
  return sum_ops(*this, [](const Operator& o) { return o.param_elems; });
}

OperatorGraph build_gpt_graph(const ModelSpec& model, double bsz, long seq, double attention_density) {
  return Builder(model, bsz, seq, attention_density).build();
}

}  // namespace memwall

namespace memwall {

GemmShape linear_gemm_shape(OpRole role, long hidden, long tokens, int mp, int tiles) {
  const long C = hidden;
  mp = std::max(1, mp);
  tiles = std::max(1, tiles);
  switch (role) {
    case OpRole::qkv: return {tokens, 3 * C / mp / tiles, C};
    case OpRole::fc1: return {tokens, 4 * C / mp / tiles, C};
    case OpRole::proj: return {tokens, C / tiles, C / mp};
    case OpRole::fc2: return {tokens, C / tiles, 4 * C / mp};
    default: return {};
  }
}

}  // namespace memwall
