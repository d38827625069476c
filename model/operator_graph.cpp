#include "model/operator_graph.hpp"

#include <algorithm>
#include <boost/graph/topological_sort.hpp>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>
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
    case OpRole::router: return "router";
  }
  return "?";
}

double norm_param_elems(const ModelSpec& m) {
  return m.norm == NormKind::rmsnorm ? double(m.hidden) : 2.0 * double(m.hidden);
}

double embed_param_elems(const ModelSpec& m, long seq) {
  return (double(m.vocab) + (m.positions == PositionKind::learned ? double(seq) : 0.0)) * double(m.hidden);
}

double head_param_elems(const ModelSpec& m) { return m.tied_embeddings ? 0.0 : double(m.vocab) * double(m.hidden); }

void BlockParamOps::push_back(const BlockParamOp& op) {
  if (n_ == kMax) throw std::logic_error("block_param_ops: more than " + std::to_string(kMax) + " operators");
  ops_[n_++] = op;
}

namespace {
BlockParamOps make_block_param_ops(const ModelSpec& m) {
  const long C = m.hidden, A = m.attention_width(), kv_out = 2L * m.kv() * m.head_dim();
  const bool qkv_bias = m.bias != BiasKind::none, attn_bias = m.bias == BiasKind::all || m.bias == BiasKind::attention;
  const bool mlp_bias = m.bias == BiasKind::all;
  auto linear = [](OpRole role, long in, long out, bool bias, int copies = 1, int active = 1) {
    BlockParamOp op{role, true, in, out, copies, active, bias ? double(out) : 0.0};
    op.elems = copies * (double(in) * double(out) + op.bias);
    return op;
  };
  auto norm = [&](OpRole role) {
    BlockParamOp op{role};
    op.elems = norm_param_elems(m);
    return op;
  };
  const long inner = m.is_moe() ? m.moe.expert_intermediate : m.ffn_size();
  const int copies = m.is_moe() ? m.moe.experts + m.moe.shared_experts : 1;
  const int active = m.is_moe() ? m.moe.experts_per_token + m.moe.shared_experts : 1;
  BlockParamOps ops;
  for (const BlockParamOp& op : {norm(OpRole::ln1), linear(OpRole::qkv, C, A + kv_out, qkv_bias),
                                 linear(OpRole::proj, A, C, attn_bias), norm(OpRole::ln2)})
    ops.push_back(op);
  if (m.is_moe()) ops.push_back(linear(OpRole::router, C, m.moe.experts, false));
  ops.push_back(linear(OpRole::fc1, C, (m.gated() ? 2 : 1) * inner, mlp_bias, copies, active));
  ops.push_back(linear(OpRole::fc2, inner, C, mlp_bias, copies, active));
  return ops;
}
}  // namespace

BlockParamOps block_param_ops(const ModelSpec& m) {
  // The planner asks for one model's list in its inner loops (every candidate's time and fit): the
  // last list made is kept per thread, keyed by every field it reads.
  using Key = std::tuple<long, int, int, long, FfnKind, long, BiasKind, NormKind, int, int, long, int>;
  const Key key{m.hidden, m.heads,  m.kv(),       m.head_dim(),        m.ffn,        m.ffn_size(),
                m.bias,   m.norm,   m.moe.experts, m.moe.experts_per_token, m.moe.expert_intermediate,
                m.moe.shared_experts};
  thread_local std::optional<std::pair<Key, BlockParamOps>> last;
  if (!last || last->first != key) last.emplace(key, make_block_param_ops(m));
  return last->second;
}

double active_block_weight_elems(const ModelSpec& m) {
  double w = 0;
  for (const BlockParamOp& op : block_param_ops(m))
    if (op.linear) w += op.active * double(op.in) * double(op.out);
  return w;
}

double attention_share(const ModelSpec& m, long seq, double attention_density) {
  const double window = m.attention_window > 0 && m.attention_window < seq ? double(m.attention_window) / double(seq) : 1.0;
  return attention_density * window;
}

std::string op_name(OpRole role, int block) {
  return block >= 0 ? "block" + std::to_string(block) + "." + to_string(role) : to_string(role);
}

namespace {

constexpr double kAct = kGraphActBytes;  // bytes per fp16 activation element

class Builder {
 public:
  Builder(const ModelSpec& m, double bsz, long seq, double density)
      : m_(m), tokens_(bsz * double(seq)), bsz_(bsz), seq_(seq), share_(attention_share(m, seq, density)),
        ops_(block_param_ops(m)) {}

  size_t add(Operator op, std::initializer_list<size_t> inputs) {
    if (op.param_owner.empty() && op.param_elems > 0) op.param_owner = op.name;
    size_t v = boost::add_vertex(op, g_);
    for (size_t in : inputs) boost::add_edge(in, v, g_);
    return v;
  }

  // A linear layer of `copies` experts of which `active` run on each token (1 and 1 when dense).
  Operator linear(const BlockParamOp& p, int block) {
    Operator op{op_name(p.role, block), OpKind::linear, block, p.role, p.in, p.out};
    const double w = double(p.in) * double(p.out);
    op.weight_elems = p.copies * w;
    op.param_elems = p.elems;
    op.active_elems = p.active * (w + p.bias);
    op.copies = p.copies;
    op.fwd_flops = 2.0 * tokens_ * p.active * w;
    op.bwd_flops = 2.0 * op.fwd_flops;  // input gradient and weight gradient
    op.act_read_bytes = kAct * tokens_ * p.active * double(p.in);
    op.act_write_bytes = kAct * tokens_ * p.active * double(p.out);
    return op;
  }
  Operator linear(OpRole role, int block) {
    for (const BlockParamOp& p : ops_)
      if (p.role == role) return linear(p, block);
    throw std::logic_error("operator_graph: no block operator " + std::string(to_string(role)));
  }

  // Elementwise operators: FLOPs are small approximate counts per element (LayerNorm ~8, GeLU ~8,
  // add 1); they matter only to show what Eq. 7 leaves out.
  Operator elementwise(OpRole role, OpKind kind, int block, double elems, double flops_per_elem,
                       double param_elems, int inputs) {
    Operator op{op_name(role, block), kind, block, role};
    op.param_elems = param_elems;
    op.active_elems = param_elems;
    op.fwd_flops = flops_per_elem * elems;
    op.bwd_flops = 2.0 * op.fwd_flops;
    op.act_read_bytes = kAct * elems * inputs;
    op.act_write_bytes = kAct * elems;
    return op;
  }

  OperatorGraph build() {
    const long C = m_.hidden;
    const double TC = tokens_ * double(C), norm = norm_param_elems(m_);
    const double kv_share = double(m_.kv()) / double(m_.heads);  // K and V against Q: GQA's saving
    Operator embed{"embed", OpKind::embedding, -1, OpRole::embed};
    embed.param_elems = embed_param_elems(m_, seq_);  // token (V, C) + learned positions (T, C)
    embed.active_elems = embed.param_elems;
    embed.act_write_bytes = kAct * TC;
    size_t x = add(embed, {});
    for (int b = 0; b < m_.layers; ++b) {
      size_t ln1 = add(elementwise(OpRole::ln1, OpKind::layernorm, b, TC, 8, norm, 1), {x});
      size_t qkv = add(linear(OpRole::qkv, b), {ln1});
      // (B, NH, T, T) = (B, NH, T, C/NH) x (B, NH, C/NH, T): 2·B·T²·C FLOPs, and the same for context;
      // block-sparse attention and a sliding window compute and store only `share_` of the (T, T) blocks.
      Operator scores{op_name(OpRole::attn_scores, b), OpKind::attention_scores, b, OpRole::attn_scores};
      // (with an explicit head size, heads x head_dim channels in place of C)
      const double A = double(m_.attention_width()), TA = tokens_ * A;
      scores.fwd_flops = 2.0 * bsz_ * double(seq_) * double(seq_) * A * share_;
      scores.bwd_flops = 2.0 * scores.fwd_flops;
      scores.act_read_bytes = kAct * (1 + kv_share) * TA;  // queries and keys
      scores.act_write_bytes = kAct * bsz_ * m_.heads * double(seq_) * double(seq_) * share_;
      size_t sc = add(scores, {qkv});
      Operator context{op_name(OpRole::attn_context, b), OpKind::attention_context, b, OpRole::attn_context};
      context.fwd_flops = scores.fwd_flops;
      context.bwd_flops = scores.bwd_flops;
      context.act_read_bytes = scores.act_write_bytes + kAct * kv_share * TA;  // and values
      context.act_write_bytes = kAct * TA;
      size_t ctx = add(context, {sc, qkv});
      size_t proj = add(linear(OpRole::proj, b), {ctx});
      size_t res1 = add(elementwise(OpRole::residual1, OpKind::residual_add, b, TC, 1, 0, 2), {x, proj});
      size_t ln2 = add(elementwise(OpRole::ln2, OpKind::layernorm, b, TC, 8, norm, 1), {res1});
      size_t ffn_in = ln2;
      if (m_.is_moe()) ffn_in = add(linear(OpRole::router, b), {ln2});
      const Operator fc1_op = linear(OpRole::fc1, b);
      size_t fc1 = add(fc1_op, {ffn_in});
      // the activation: GeLU of fc1's output, or gated: SiLU/GeLU of the gate half times the up half
      const double inner = fc1_op.act_write_bytes / kAct / (m_.gated() ? 2 : 1);
      size_t act = add(elementwise(OpRole::gelu, OpKind::gelu, b, inner, 8, 0, m_.gated() ? 2 : 1), {fc1});
      size_t fc2 = add(linear(OpRole::fc2, b), {act});
      x = add(elementwise(OpRole::residual2, OpKind::residual_add, b, TC, 1, 0, 2), {res1, fc2});
    }
    size_t lnf = add(elementwise(OpRole::ln_f, OpKind::layernorm, -1, TC, 8, norm, 1), {x});
    Operator head{"lm_head", OpKind::lm_head, -1, OpRole::lm_head, C, m_.vocab};
    head.param_elems = head_param_elems(m_);  // untied: its own (V, C)
    head.active_elems = head.param_elems;
    if (m_.tied_embeddings) head.param_owner = "embed";  // the token embedding's: an external parameter
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
  double share_;
  BlockParamOps ops_;
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
double OperatorGraph::active_param_elems() const {
  return sum_ops(*this, [](const Operator& o) { return o.active_elems; });
}

OperatorGraph build_gpt_graph(const ModelSpec& model, double bsz, long seq, double attention_density) {
  return Builder(model, bsz, seq, attention_density).build();
}

}  // namespace memwall

namespace memwall {

GemmShape linear_gemm_shape(const ModelSpec& m, OpRole role, long tokens, int mp, int tiles) {
  mp = std::max(1, mp);
  tiles = std::max(1, tiles);
  for (const BlockParamOp& p : block_param_ops(m)) {
    if (p.role != role || !p.linear) continue;
    // an expert sees its share of the tokens: each token goes to `active` of `copies`
    const long rows = p.copies > 1 ? std::max(1L, long(double(tokens) * p.active / p.copies)) : tokens;
    const bool row_parallel = role == OpRole::proj || role == OpRole::fc2;  // the rest column-parallel
    if (row_parallel) return {rows, p.out / tiles, p.in / mp};
    return {rows, p.out / mp / tiles, p.in};
  }
  return {};
}

}  // namespace memwall
