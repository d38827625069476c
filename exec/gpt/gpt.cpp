// GPT operators on a Backend. Each operator's forward is one kernel (or a GEMM and a bias); each
// backward quotes the forward line it differentiates.
#include "exec/gpt/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace memwall::exec {

ModelSpec gpt_model_spec(const GptConfig& g) {
  ModelSpec m;
  m.name = "gpt";
  m.source = "run config";
  m.layers = g.layers;
  m.hidden = g.hidden;
  m.heads = g.heads;
  m.seq = g.max_seq;
  m.vocab = g.vocab;
  return m;
}

std::vector<ParamTensor> gpt_param_tensors(const GptConfig& c) {
  const long C = c.hidden, V = c.vocab;
  std::vector<ParamTensor> t;
  std::size_t off = 0;
  auto add = [&](std::string name, std::vector<long> shape) {
    std::size_t n = 1;
    for (long s : shape) n *= std::size_t(s);
    t.push_back({std::move(name), std::move(shape), off, n});
    off += n;
  };
  add("embed.wte", {V, C});
  add("embed.wpe", {c.max_seq, C});
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "block" + std::to_string(l) + ".";
    add(p + "ln1.weight", {C});
    add(p + "ln1.bias", {C});
    add(p + "qkv.weight", {3 * C, C});
    add(p + "qkv.bias", {3 * C});
    add(p + "proj.weight", {C, C});
    add(p + "proj.bias", {C});
    add(p + "ln2.weight", {C});
    add(p + "ln2.bias", {C});
    add(p + "fc1.weight", {4 * C, C});
    add(p + "fc1.bias", {4 * C});
    add(p + "fc2.weight", {C, 4 * C});
    add(p + "fc2.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return t;
}

std::vector<ParamGroup> gpt_param_groups(const GptConfig& c) {
  std::vector<ParamGroup> groups;
  for (const ParamTensor& t : gpt_param_tensors(c)) {
    const std::string g = t.name.substr(0, t.name.rfind('.'));
    if (groups.empty() || groups.back().name != g) {
      ParamGroup pg{g, t.offset, 0};
      if (t.name.ends_with(".weight") && t.shape.size() == 2) {
        pg.linear = true;
        pg.out_features = t.shape[0];
        pg.in_features = t.shape[1];
      }
      groups.push_back(pg);
    }
    groups.back().elems += t.elems;
  }
  return groups;
}

namespace {

std::uint64_t mix(std::uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
std::uint64_t name_key(const std::string& name) {  // FNV-1a
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}
// A standard normal from (key, i) alone: Box-Muller on two uniforms hashed from the counter.
double normal_at(std::uint64_t key, std::uint64_t i) {
  const double u1 = (double(mix(key ^ mix(2 * i + 0x9E3779B97F4A7C15ull)) >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = (double(mix(key ^ mix(2 * i + 1 + 0x9E3779B97F4A7C15ull)) >> 11) + 0.5) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// How one tensor is initialised, decided once from its name (not per element: the string tests
// and the name's hash cost more than the element's own draw, 20 s for a 150 M parameter model).
struct TensorInit {
  std::size_t elems;
  enum Kind { one, zero, normal } kind;
  double std_dev;
  std::uint64_t key;
};

std::vector<TensorInit> tensor_inits(const GptConfig& c, const ParamGroup& g) {
  std::vector<TensorInit> out;
  for (const ParamTensor& t : gpt_param_tensors(c)) {
    if (t.offset < g.offset || t.offset >= g.offset + g.elems) continue;
    const bool ln_weight = t.name.ends_with("ln1.weight") || t.name.ends_with("ln2.weight") || t.name == "ln_f.weight";
    const bool resid = t.name.ends_with("proj.weight") || t.name.ends_with("fc2.weight");
    const TensorInit::Kind kind = ln_weight                     ? TensorInit::one
                                  : t.name.ends_with(".bias") ? TensorInit::zero
                                                              : TensorInit::normal;
    out.push_back({t.elems, kind, resid ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02, name_key(t.name)});
  }
  return out;
}

// The group's element at flat offset `at` (the parameter array's order within the group).
float init_at(const std::vector<TensorInit>& tensors, std::size_t at) {
  for (const TensorInit& t : tensors) {
    if (at >= t.elems) {
      at -= t.elems;
      continue;
    }
    switch (t.kind) {
      case TensorInit::one: return 1.0f;
      case TensorInit::zero: return 0.0f;
      case TensorInit::normal: return float(t.std_dev * normal_at(t.key, at));
    }
  }
  return 0.0f;
}

}  // namespace

void gpt_init_group(const GptConfig& c, std::uint64_t seed, const ParamGroup& g, int tiles, std::size_t from,
                    std::size_t count, float* out) {
  std::vector<TensorInit> tensors = tensor_inits(c, g);
  for (TensorInit& t : tensors) t.key ^= seed;
  const bool tiled = g.linear && tiles > 1;
  const std::size_t IC = std::size_t(g.in_features), OC = std::size_t(g.out_features);
  const std::size_t OCt = tiled ? OC / std::size_t(tiles) : OC, per_tile = OCt * (IC + 1);
  // each element is a function of its index alone, so threads change no bit
#pragma omp parallel for schedule(static) if (count >= (1u << 16))
  for (std::size_t k = 0; k < count; ++k) {
    std::size_t p = from + k, flat = p;
    if (tiled) {  // tile-major position -> the group's own order (weight rows, then bias)
      const std::size_t t = p / per_tile, q = p % per_tile;
      flat = q < OCt * IC ? t * OCt * IC + q : OC * IC + t * OCt + (q - OCt * IC);
    }
    out[k] = init_at(tensors, flat);
  }
}

std::vector<float> gpt_init_params(const GptConfig& c, std::uint64_t seed) {
  std::size_t n = 0;
  const std::vector<ParamGroup> groups = gpt_param_groups(c);
  for (const ParamGroup& g : groups) n += g.elems;
  std::vector<float> p(n);
  for (const ParamGroup& g : groups) gpt_init_group(c, seed, g, 1, 0, g.elems, p.data() + g.offset);
  return p;
}

namespace {
// Copies rows of a (OC, IC) weight and entries of its (OC) bias between the two orders.
template <bool kToTiles>
void permute(const ParamGroup& g, int tiles, const float* in, float* out) {
  if (!g.linear || tiles <= 1) {
    std::memcpy(out, in, g.elems * sizeof(float));
    return;
  }
  const std::size_t IC = std::size_t(g.in_features), OC = std::size_t(g.out_features), OCt = OC / std::size_t(tiles);
  for (std::size_t t = 0; t < std::size_t(tiles); ++t) {
    const std::size_t tile_at = t * OCt * (IC + 1);  // [W_t (OCt, IC), b_t (OCt)]
    for (std::size_t r = 0; r < OCt * IC; ++r) {
      const std::size_t flat = t * OCt * IC + r, tiled = tile_at + r;
      (kToTiles ? out[tiled] : out[flat]) = kToTiles ? in[flat] : in[tiled];
    }
    for (std::size_t r = 0; r < OCt; ++r) {
      const std::size_t flat = OC * IC + t * OCt + r, tiled = tile_at + OCt * IC + r;
      (kToTiles ? out[tiled] : out[flat]) = kToTiles ? in[flat] : in[tiled];
    }
  }
}
}  // namespace

void to_tile_major(const ParamGroup& g, int tiles, const float* in, float* out) { permute<true>(g, tiles, in, out); }
void from_tile_major(const ParamGroup& g, int tiles, const float* in, float* out) {
  permute<false>(g, tiles, in, out);
}

int param_group_of(const GptConfig& cfg, OpKind kind, int block) {
  // gpt_param_groups' order: embed, then per block ln1, qkv, proj, ln2, fc1, fc2, then ln_f
  int in_block = -1;
  switch (kind) {
    case OpKind::embed:
    case OpKind::lm_head: return 0;
    case OpKind::ln_f: return 1 + 6 * cfg.layers;
    case OpKind::ln1: in_block = 0; break;
    case OpKind::qkv: in_block = 1; break;
    case OpKind::proj: in_block = 2; break;
    case OpKind::ln2: in_block = 3; break;
    case OpKind::fc1: in_block = 4; break;
    case OpKind::fc2: in_block = 5; break;
    default: return -1;
  }
  return block >= 0 && block < cfg.layers ? 1 + 6 * block + in_block : -1;
}

// ---- workspace -------------------------------------------------------------------------------

struct GptOps::Layout {
  std::size_t BT, C, V, NH, T;
  int ci, mbs;
  std::size_t staging = 0;  // floats

  Layout(const GptConfig& c, int B, int T_, int ci_, int mbs_, int tiles)
      : BT(std::size_t(B) * T_), C(std::size_t(c.hidden)), V(std::size_t(c.vocab)), NH(std::size_t(c.heads)),
        T(std::size_t(T_)), ci(std::max(1, std::min(ci_, c.layers))), mbs(mbs_) {
    for (const ParamGroup& g : gpt_param_groups(c))
      staging = std::max(staging, g.linear ? g.elems / std::size_t(std::max(1, tiles)) : g.elems);
  }
  std::size_t att() const { return BT / T * NH * T * T; }  // (B, NH, T, T)

  // Walks every buffer in a fixed order; `take(floats)` returns where it goes (or counts it).
  template <typename Take>
  void carve(std::vector<MicroBatch>& mb, float*& wstage, float*& gstage, Take take) const {
    wstage = take(staging);
    gstage = take(staging);
    mb.resize(std::size_t(mbs));
    for (MicroBatch& m : mb) {
      m.tokens = reinterpret_cast<int*>(take(BT));
      m.targets = reinterpret_cast<int*>(take(BT));
      m.stream[0] = take(BT * C);
      m.stream[1] = take(BT * C);
      m.ws.resize(std::size_t(ci));
      for (BlockActs& a : m.ws) {
        a.ln1 = take(BT * C), a.ln1_mean = take(BT), a.ln1_rstd = take(BT), a.qkv = take(BT * 3 * C);
        a.att = take(att()), a.atty = take(BT * C), a.attproj = take(BT * C), a.res2 = take(BT * C);
        a.ln2 = take(BT * C), a.ln2_mean = take(BT), a.ln2_rstd = take(BT), a.fch = take(BT * 4 * C);
        a.fch_gelu = take(BT * 4 * C), a.fcproj = take(BT * C), a.res3 = take(BT * C);
      }
      m.segment_input = nullptr;
      m.lnf = take(BT * C), m.lnf_mean = take(BT), m.lnf_rstd = take(BT);
      m.logits = take(BT * V), m.probs = take(BT * V), m.dlogits = take(BT * V), m.losses = take(BT);
      m.dx = take(BT * C), m.dA = take(BT * C), m.dB = take(BT * 4 * C), m.dC = take(BT * 4 * C);
      m.datt = take(att());
    }
  }
};

namespace {
constexpr std::size_t kAlign = 256;  // bytes: cudaMalloc's alignment, enough for every kernel
std::size_t aligned(std::size_t floats) { return (floats * sizeof(float) + kAlign - 1) / kAlign * kAlign; }
}  // namespace

std::size_t GptOps::workspace_bytes(const GptConfig& cfg, int B, int T, int ci, int micro_batches, int tiles) {
  Layout l(cfg, B, T, ci, micro_batches, tiles);
  std::size_t total = 0;
  std::vector<MicroBatch> mb;
  float *w = nullptr, *g = nullptr;
  l.carve(mb, w, g, [&](std::size_t n) -> float* {
    total += aligned(n);
    return nullptr;
  });
  return total;
}

Result<std::unique_ptr<GptOps>> GptOps::create(Backend& backend, const GptConfig& cfg, int B, int T, int ci,
                                               int micro_batches, int tiles, void* workspace, std::size_t bytes) {
  if (cfg.layers < 1 || cfg.hidden < 1 || cfg.heads < 1 || cfg.hidden % cfg.heads != 0)
    return make_error("hidden (" + std::to_string(cfg.hidden) + ") must be a positive multiple of heads (" +
                      std::to_string(cfg.heads) + ")");
  if (T < 1 || T > cfg.max_seq || B < 1 || micro_batches < 1)
    return make_error("seq must be between 1 and the model's " + std::to_string(cfg.max_seq) + ", bsz >= 1");
  for (const ParamGroup& g : gpt_param_groups(cfg))
    if (g.linear && tiles > 1 && g.out_features % tiles != 0)
      return make_error("tiling " + std::to_string(tiles) + " must divide the output features of every linear layer (" +
                        g.name + " has " + std::to_string(g.out_features) + ")");
  const std::size_t need = workspace_bytes(cfg, B, T, ci, micro_batches, tiles);
  if (bytes < need || reinterpret_cast<std::uintptr_t>(workspace) % kAlign != 0)
    return make_error("GPT workspace: " + std::to_string(need) + " bytes aligned to " + std::to_string(kAlign) +
                      " needed, got " + std::to_string(bytes));
  std::unique_ptr<GptOps> g(new GptOps(backend, cfg, B, T, std::max(1, std::min(ci, cfg.layers)), micro_batches));
  Layout l(cfg, B, T, ci, micro_batches, tiles);
  char* at = static_cast<char*>(workspace);
  l.carve(g->mb_, g->weight_staging_, g->grad_staging_, [&](std::size_t n) {
    float* p = reinterpret_cast<float*>(at);
    at += aligned(n);
    return p;
  });
  g->staging_elems_ = l.staging;
  return g;
}

// ---- operators -------------------------------------------------------------------------------

const float* GptOps::block_input(int b, int u) const { return mb_[std::size_t(u)].stream[b % 2]; }

const float* GptOps::block_in(int b, int u, bool recompute) const {
  const MicroBatch& m = mb_[std::size_t(u)];
  if (!recompute) return m.stream[b % 2];
  if (b % ci_ == 0) return m.segment_input;                 // the loaded checkpoint
  return m.ws[std::size_t((b - 1) % ci_)].res3;             // the previous block of the segment
}

float* GptOps::block_out(int b, int u, bool recompute) {
  MicroBatch& m = mb_[std::size_t(u)];
  return recompute ? m.ws[std::size_t(b % ci_)].res3 : m.stream[(b + 1) % 2];
}

// A linear operator, or one tile of its output columns: out (BT, OC) columns [o0, o0 + OCt).
void GptOps::linear_forward(const OpCall& c, float* out, const float* inp, long IC, long OC) {
  const int BT = B_ * T_;
  const long OCt = OC / c.tiles, o0 = c.tile < 0 ? 0 : c.tile * OCt;
  const float* W = c.params;          // (OCt, IC)
  const float* bias = W + OCt * IC;   // (OCt)
  // out[:, o0:o0+OCt] = inp (BT, IC) . W^T; then += bias
  be_.ops().gemm(be_.ctx(), false, true, BT, int(OCt), int(IC), 1.0f, inp, int(IC), 0, W, int(IC), 0, 0.0f, out + o0,
                 int(OC), 0, 1);
  be_.ops().bias_forward(be_.ctx(), out + o0, bias, BT, int(OCt), int(OC));
}

void GptOps::linear_backward(const OpCall& c, float* dinp, const float* dout, const float* inp, long IC, long OC) {
  const int BT = B_ * T_;
  const long OCt = OC / c.tiles, o0 = c.tile < 0 ? 0 : c.tile * OCt;
  const float* W = c.params;
  float* dW = c.grads;
  float* dbias = dW + OCt * IC;
  // forward: out[:, tile] = inp . W^T + bias
  // dinp (BT, IC) += dout[:, tile] (BT, OCt) . W (OCt, IC): tiles add their parts
  be_.ops().gemm(be_.ctx(), false, false, BT, int(IC), int(OCt), 1.0f, dout + o0, int(OC), 0, W, int(IC), 0, 1.0f,
                 dinp, int(IC), 0, 1);
  // dW (OCt, IC) += dout[:, tile]^T (OCt, BT) . inp (BT, IC)
  be_.ops().gemm(be_.ctx(), true, false, int(OCt), int(IC), BT, 1.0f, dout + o0, int(OC), 0, inp, int(IC), 0, 1.0f, dW,
                 int(IC), 0, 1);
  be_.ops().bias_backward(be_.ctx(), dbias, dout + o0, BT, int(OCt), int(OC));
}

void GptOps::forward(const OpCall& c) {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden, V = cfg_.vocab, NH = cfg_.heads, b = c.op.block, u = c.micro_batch;
  MicroBatch& m = mb_[std::size_t(u)];
  switch (c.op.kind) {
    case OpKind::embed:
      // stream[0] (B, T, C) = wte[tokens] + wpe[t]; wte (V, C) then wpe (maxT, C) in the group
      k.encoder_forward(cx, m.stream[0], m.tokens, c.params, c.params + std::size_t(V) * C, B_, T_, C);
      return;
    case OpKind::ln1: {
      BlockActs& a = acts(b, u);
      k.layernorm_forward(cx, a.ln1, a.ln1_mean, a.ln1_rstd, block_in(b, u, c.recompute), c.params, c.params + C, BT, C);
      return;
    }
    case OpKind::qkv: linear_forward(c, acts(b, u).qkv, acts(b, u).ln1, C, 3L * C); return;
    case OpKind::attn_scores: k.attention_scores_forward(cx, acts(b, u).att, acts(b, u).qkv, B_, T_, C, NH); return;
    case OpKind::attn_context:
      k.attention_context_forward(cx, acts(b, u).atty, acts(b, u).att, acts(b, u).qkv, B_, T_, C, NH);
      return;
    case OpKind::proj: linear_forward(c, acts(b, u).attproj, acts(b, u).atty, C, C); return;
    case OpKind::residual1:
      k.residual_forward(cx, acts(b, u).res2, block_in(b, u, c.recompute), acts(b, u).attproj, long(BT) * C);
      return;
    case OpKind::ln2: {
      BlockActs& a = acts(b, u);
      k.layernorm_forward(cx, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, c.params, c.params + C, BT, C);
      return;
    }
    case OpKind::fc1: linear_forward(c, acts(b, u).fch, acts(b, u).ln2, C, 4L * C); return;
    case OpKind::gelu: k.gelu_forward(cx, acts(b, u).fch_gelu, acts(b, u).fch, long(BT) * 4 * C); return;
    case OpKind::fc2: linear_forward(c, acts(b, u).fcproj, acts(b, u).fch_gelu, 4L * C, C); return;
    case OpKind::residual2:
      k.residual_forward(cx, block_out(b, u, c.recompute), acts(b, u).res2, acts(b, u).fcproj, long(BT) * C);
      return;
    case OpKind::ln_f:
      k.layernorm_forward(cx, m.lnf, m.lnf_mean, m.lnf_rstd, m.stream[cfg_.layers % 2], c.params, c.params + C, BT, C);
      return;
    case OpKind::lm_head:
      // logits (BT, V) = lnf (BT, C) . wte^T: the LM head tied to the token embedding
      k.gemm(cx, false, true, BT, V, C, 1.0f, m.lnf, C, 0, c.params, C, 0, 0.0f, m.logits, V, 0, 1);
      k.crossentropy_forward(cx, m.probs, m.losses, m.logits, m.targets, BT, V);
      return;
    case OpKind::router:  // a mixture of experts: the engine refuses it before any step runs
      throw std::logic_error("GptOps: the paper's GPT has no router");
  }
}

void GptOps::backward(const OpCall& c) {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden, V = cfg_.vocab, NH = cfg_.heads, b = c.op.block, u = c.micro_batch;
  const std::size_t f = sizeof(float), btc = std::size_t(BT) * C;
  MicroBatch& m = mb_[std::size_t(u)];
  // the first tile of a linear operator in backward order (tiles run last to first) clears dinp
  const bool first_part = c.tile < 0 || c.tile == c.tiles - 1;
  switch (c.op.kind) {
    case OpKind::lm_head:
      // loss = mean over every position of every micro-batch of every micro-step of every rank:
      // dlosses = 1 / (BT * micro-batches * micro-steps * ranks)
      k.memset_zero(cx, m.dlogits, std::size_t(BT) * V * f);
      k.crossentropy_backward(cx, m.dlogits, m.probs, m.targets,
                              1.0f / (float(BT) * float(micro_batches_) * float(micro_steps_) * float(ranks_)), BT, V);
      // logits = lnf . wte^T: dlnf (into dA) = dlogits . wte; dwte += dlogits^T . lnf
      k.memset_zero(cx, m.dA, btc * f);
      k.gemm(cx, false, false, BT, C, V, 1.0f, m.dlogits, V, 0, c.params, C, 0, 1.0f, m.dA, C, 0, 1);
      k.gemm(cx, true, false, V, C, BT, 1.0f, m.dlogits, V, 0, m.lnf, C, 0, 1.0f, c.grads, C, 0, 1);
      return;
    case OpKind::ln_f:
      // lnf = layernorm(x_L): dx = d(x_L)
      k.memset_zero(cx, m.dx, btc * f);
      k.layernorm_backward(cx, m.dx, c.grads, c.grads + C, m.dA, m.stream[cfg_.layers % 2], c.params, m.lnf_mean,
                           m.lnf_rstd, BT, C);
      return;
    case OpKind::residual2:  // res3 = res2 + fcproj: d(res2) = d(fcproj) = dx, so dx carries on as d(res2)
    case OpKind::residual1:  // res2 = x + attproj: d(x) = d(attproj) = dx, so dx carries on as d(x)
      return;
    case OpKind::fc2: {
      // fcproj = fc2(fch_gelu): d(fch_gelu) into dB
      if (first_part) k.memset_zero(cx, m.dB, 4 * btc * f);
      linear_backward(c, m.dB, m.dx, acts(b, u).fch_gelu, 4L * C, C);
      return;
    }
    case OpKind::gelu:
      // fch_gelu = gelu(fch): d(fch) into dC
      k.memset_zero(cx, m.dC, 4 * btc * f);
      k.gelu_backward(cx, m.dC, acts(b, u).fch, m.dB, long(BT) * 4 * C);
      return;
    case OpKind::fc1:
      // fch = fc1(ln2): d(ln2) into dA
      if (first_part) k.memset_zero(cx, m.dA, btc * f);
      linear_backward(c, m.dA, m.dC, acts(b, u).ln2, C, 4L * C);
      return;
    case OpKind::ln2: {
      // ln2 = layernorm(res2): adds into d(res2) = dx
      BlockActs& a = acts(b, u);
      k.layernorm_backward(cx, m.dx, c.grads, c.grads + C, m.dA, a.res2, c.params, a.ln2_mean, a.ln2_rstd, BT, C);
      return;
    }
    case OpKind::proj:
      // attproj = proj(atty): d(atty) into dA
      if (first_part) k.memset_zero(cx, m.dA, btc * f);
      linear_backward(c, m.dA, m.dx, acts(b, u).atty, C, C);
      return;
    case OpKind::attn_context:
      // atty = att . v: d(att) into datt, d(v) into the v part of d(qkv) (dB)
      k.memset_zero(cx, m.datt, std::size_t(B_) * NH * T_ * T_ * f);
      k.memset_zero(cx, m.dB, 3 * btc * f);
      k.attention_context_backward(cx, m.datt, m.dB, m.dA, acts(b, u).att, acts(b, u).qkv, B_, T_, C, NH);
      return;
    case OpKind::attn_scores:
      // att = softmax(q . k / sqrt(hs)): d(q), d(k) into d(qkv) (dB)
      k.attention_scores_backward(cx, m.dB, m.datt, acts(b, u).att, acts(b, u).qkv, B_, T_, C, NH);
      return;
    case OpKind::qkv:
      // qkv = qkv(ln1): d(ln1) into dA
      if (first_part) k.memset_zero(cx, m.dA, btc * f);
      linear_backward(c, m.dA, m.dB, acts(b, u).ln1, C, 3L * C);
      return;
    case OpKind::ln1: {
      // ln1 = layernorm(x): adds into d(x) = dx
      BlockActs& a = acts(b, u);
      k.layernorm_backward(cx, m.dx, c.grads, c.grads + C, m.dA, block_in(b, u, true), c.params, a.ln1_mean,
                           a.ln1_rstd, BT, C);
      return;
    }
    case OpKind::embed:
      // stream[0] = wte[tokens] + wpe[t]
      k.encoder_backward(cx, c.grads, c.grads + std::size_t(V) * C, m.dx, m.tokens, B_, T_, C);
      return;
    case OpKind::router:  // a mixture of experts: the engine refuses it before any step runs
      throw std::logic_error("GptOps: the paper's GPT has no router");
  }
}

}  // namespace memwall::exec
