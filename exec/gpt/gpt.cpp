// GPT forward and backward on a Backend. Each layer is a kernel call (or a GEMM and a bias); the
// backward of each quotes the forward line it differentiates.
#include "exec/gpt/gpt.hpp"

#include <cmath>
#include <random>

namespace memwall::exec {

// Per-block tensor order inside the parameter array (after wte, wpe).
enum BlockTensor { kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFc1W, kFc1B, kFc2W, kFc2B, kPerBlock };


namespace {
std::size_t block_act_floats(const GptConfig& c, int B, int T) {
  const std::size_t BT = std::size_t(B) * T, C = std::size_t(c.hidden);
  return BT * C * 18 + BT * 4 + std::size_t(B) * c.heads * T * T;
}
int blocks_per_segment(const GptConfig& c, int ci) { return ci <= 0 || ci >= c.layers ? c.layers : ci; }
}  // namespace

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
    if (groups.empty() || groups.back().name != g) groups.push_back({g, t.offset, 0});
    groups.back().elems += t.elems;
  }
  return groups;
}

GptMemory gpt_memory(const GptConfig& c, int B, int T, int ci) {
  const std::size_t BT = std::size_t(B) * T, C = std::size_t(c.hidden), V = std::size_t(c.vocab), f = sizeof(float);
  std::size_t n = 0;
  for (const ParamTensor& t : gpt_param_tensors(c)) n += t.elems;
  const int per_seg = blocks_per_segment(c, ci);
  const int segs = (c.layers + per_seg - 1) / per_seg;
  GptMemory m;
  m.params_bytes = n * f;
  m.grads_bytes = n * f;
  m.activations_bytes = (block_act_floats(c, B, T) * std::size_t(per_seg) + BT * C + 2 * BT + 2 * BT * V + BT) * f;
  m.checkpoints_bytes = std::size_t(segs) * BT * C * f;
  m.scratch_bytes = (2 * BT * C + 2 * BT * 4 * C) * f + 2 * BT * sizeof(int);
  return m;
}

std::vector<float> gpt_init_params(const GptConfig& c, std::uint64_t seed) {
  // splitmix64 + Box-Muller: the same numbers on every platform (std::normal_distribution is not)
  std::uint64_t s = seed;
  auto next = [&s] {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  auto uniform = [&] { return (double(next() >> 11) + 0.5) * 0x1.0p-53; };
  auto normal = [&] { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform()); };
  std::vector<float> p;
  const double resid_std = 0.02 / std::sqrt(2.0 * c.layers);
  for (const ParamTensor& t : gpt_param_tensors(c)) {
    const bool ln_weight = t.name.ends_with("ln1.weight") || t.name.ends_with("ln2.weight") || t.name == "ln_f.weight";
    const bool bias = t.name.ends_with(".bias");
    const bool resid = t.name.ends_with("proj.weight") || t.name.ends_with("fc2.weight");
    for (std::size_t i = 0; i < t.elems; ++i)
      p.push_back(ln_weight ? 1.0f : bias ? 0.0f : float((resid ? resid_std : 0.02) * normal()));
  }
  return p;
}

Result<std::unique_ptr<Gpt>> Gpt::create(Backend& backend, const GptConfig& cfg, int B, int T, int ci) {
  if (cfg.layers < 1 || cfg.hidden < 1 || cfg.heads < 1 || cfg.hidden % cfg.heads != 0)
    return make_error("hidden (" + std::to_string(cfg.hidden) + ") must be a positive multiple of heads (" +
                      std::to_string(cfg.heads) + ")");
  if (T < 1 || T > cfg.max_seq || B < 1)
    return make_error("seq must be between 1 and the model's " + std::to_string(cfg.max_seq) + ", bsz >= 1");
  std::unique_ptr<Gpt> g(new Gpt(backend, cfg, B, T, blocks_per_segment(cfg, ci)));
  Result<bool> ok = g->allocate();
  if (!ok) return make_error(ok.error());
  return g;
}

Gpt::~Gpt() {
  be_.ops().synchronize(be_.ctx());
  for (void* p : allocations_) be_.ops().free(be_.ctx(), p);
}

Result<ParamGroup> Gpt::group(const std::string& name) const {
  for (const ParamGroup& g : groups_)
    if (g.name == name) return g;
  return make_error("no parameter group \"" + name + "\" (expected embed, blockN.ln1, blockN.qkv, ..., ln_f)");
}

Result<bool> Gpt::allocate() {
  tensors_ = gpt_param_tensors(cfg_);
  groups_ = gpt_param_groups(cfg_);
  for (const ParamTensor& t : tensors_) num_params_ += t.elems;
  segments_ = (cfg_.layers + ci_ - 1) / ci_;
  const std::size_t BT = std::size_t(B_) * T_, C = std::size_t(cfg_.hidden), V = std::size_t(cfg_.vocab);
  std::string error;
  auto get = [&](std::size_t n) -> float* {
    if (!error.empty()) return nullptr;
    Result<float*> p = alloc_array<float>(be_, n);
    if (!p) {
      error = p.error();
      return nullptr;
    }
    allocations_.push_back(*p);
    return *p;
  };
  params_ = get(num_params_);
  grads_ = get(num_params_);
  for (int s = 0; s < segments_; ++s) ckpt_.push_back(get(BT * C));
  for (int i = 0; i < ci_; ++i) {
    BlockActs a{};
    a.ln1 = get(BT * C), a.ln1_mean = get(BT), a.ln1_rstd = get(BT), a.qkv = get(BT * 3 * C), a.atty = get(BT * C);
    a.att = get(std::size_t(B_) * cfg_.heads * T_ * T_), a.attproj = get(BT * C), a.res2 = get(BT * C);
    a.ln2 = get(BT * C), a.ln2_mean = get(BT), a.ln2_rstd = get(BT), a.fch = get(BT * 4 * C);
    a.fch_gelu = get(BT * 4 * C), a.fcproj = get(BT * C), a.res3 = get(BT * C);
    ws_.push_back(a);
  }
  lnf_ = get(BT * C), lnf_mean_ = get(BT), lnf_rstd_ = get(BT);
  logits_ = get(BT * V), probs_ = get(BT * V), losses_ = get(BT);
  dx_ = get(BT * C), dA_ = get(BT * C), dB_ = get(BT * 4 * C), dC_ = get(BT * 4 * C);
  if (error.empty()) {
    Result<int*> t = alloc_array<int>(be_, 2 * BT);
    if (t) {
      allocations_.push_back(*t);
      tokens_ = *t;
      targets_ = *t + BT;
    } else {
      error = t.error();
    }
  }
  if (!error.empty()) return make_error(error);
  for (std::size_t i = 0, g = 0; i < tensors_.size(); ++i) {
    while (tensors_[i].offset >= groups_[g].offset + groups_[g].elems) ++g;
    tensor_group_.push_back(g);
    tensor_in_group_.push_back(tensors_[i].offset - groups_[g].offset);
  }
  for (const ParamGroup& g : groups_) {
    group_params_.push_back(params_ + g.offset);
    group_grads_.push_back(grads_ + g.offset);
  }
  return true;
}

Result<bool> Gpt::bind_group(const std::string& name, float* weights, float* grads) {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].name == name) {
      group_params_[g] = weights ? weights : params_ + groups_[g].offset;
      group_grads_[g] = grads ? grads : grads_ + groups_[g].offset;
      return true;
    }
  return make_error("no parameter group \"" + name + "\" (expected embed, blockN.ln1, blockN.qkv, ..., ln_f)");
}

std::size_t Gpt::tensor_index(int layer, int which) const { return 2 + std::size_t(layer) * kPerBlock + which; }

const float* Gpt::block_input(int l) const {
  return l % ci_ == 0 ? ckpt_[std::size_t(l / ci_)] : ws_[std::size_t((l - 1) % ci_)].res3;
}

void Gpt::linear_forward(float* out, const float* inp, std::size_t w, std::size_t b, int BT, int IC, int OC) {
  // out (BT, OC) = inp (BT, IC) . W^T, W (OC, IC); then out += bias
  be_.ops().gemm(be_.ctx(), false, true, BT, OC, IC, 1.0f, inp, IC, 0, P(w), IC, 0, 0.0f, out, OC, 0, 1);
  be_.ops().bias_forward(be_.ctx(), out, P(b), BT, OC);
}

void Gpt::linear_backward(float* dinp, const float* dout, const float* inp, std::size_t w, std::size_t b, int BT,
                          int IC, int OC) {
  // forward: out = inp . W^T + bias
  // dinp (BT, IC) += dout (BT, OC) . W (OC, IC)
  be_.ops().gemm(be_.ctx(), false, false, BT, IC, OC, 1.0f, dout, OC, 0, P(w), IC, 0, 1.0f, dinp, IC, 0, 1);
  // dW (OC, IC) += dout^T (OC, BT) . inp (BT, IC)
  be_.ops().gemm(be_.ctx(), true, false, OC, IC, BT, 1.0f, dout, OC, 0, inp, IC, 0, 1.0f, G(w), IC, 0, 1);
  be_.ops().bias_backward(be_.ctx(), G(b), dout, BT, OC);
}

void Gpt::block_forward(int l) {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden;
  const float* x = block_input(l);
  BlockActs& a = ws_[std::size_t(l % ci_)];
  auto t = [&](int which) { return tensor_index(l, which); };
  k.layernorm_forward(cx, a.ln1, a.ln1_mean, a.ln1_rstd, x, P(t(kLn1W)), P(t(kLn1B)), BT, C);
  linear_forward(a.qkv, a.ln1, t(kQkvW), t(kQkvB), BT, C, 3 * C);
  k.attention_forward(cx, a.atty, a.att, a.qkv, B_, T_, C, cfg_.heads);
  linear_forward(a.attproj, a.atty, t(kProjW), t(kProjB), BT, C, C);
  k.residual_forward(cx, a.res2, x, a.attproj, long(BT) * C);
  k.layernorm_forward(cx, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, P(t(kLn2W)), P(t(kLn2B)), BT, C);
  linear_forward(a.fch, a.ln2, t(kFc1W), t(kFc1B), BT, C, 4 * C);
  k.gelu_forward(cx, a.fch_gelu, a.fch, long(BT) * 4 * C);
  linear_forward(a.fcproj, a.fch_gelu, t(kFc2W), t(kFc2B), BT, 4 * C, C);
  k.residual_forward(cx, a.res3, a.res2, a.fcproj, long(BT) * C);
}

// dx: on entry d(res3), on exit d(block input). dA (BT, C), dB, dC (BT, 4C) are scratch.
void Gpt::block_backward(int l, float* dx) {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden;
  const std::size_t f = sizeof(float);
  const float* x = block_input(l);
  BlockActs& a = ws_[std::size_t(l % ci_)];
  auto t = [&](int which) { return tensor_index(l, which); };
  // res3 = res2 + fcproj: d(res2) = d(fcproj) = dx, so dx carries on as d(res2)
  // fcproj = fc2(fch_gelu)
  k.memset_zero(cx, dB_, std::size_t(BT) * 4 * C * f);
  linear_backward(dB_, dx, a.fch_gelu, t(kFc2W), t(kFc2B), BT, 4 * C, C);
  // fch_gelu = gelu(fch)
  k.memset_zero(cx, dC_, std::size_t(BT) * 4 * C * f);
  k.gelu_backward(cx, dC_, a.fch, dB_, long(BT) * 4 * C);
  // fch = fc1(ln2)
  k.memset_zero(cx, dA_, std::size_t(BT) * C * f);
  linear_backward(dA_, dC_, a.ln2, t(kFc1W), t(kFc1B), BT, C, 4 * C);
  // ln2 = layernorm(res2): adds into d(res2)
  k.layernorm_backward(cx, dx, G(t(kLn2W)), G(t(kLn2B)), dA_, a.res2, P(t(kLn2W)), a.ln2_mean, a.ln2_rstd, BT, C);
  // res2 = x + attproj: d(x) = d(attproj) = dx
  // attproj = proj(atty)
  k.memset_zero(cx, dA_, std::size_t(BT) * C * f);
  linear_backward(dA_, dx, a.atty, t(kProjW), t(kProjB), BT, C, C);
  // atty = attention(qkv)
  k.memset_zero(cx, dB_, std::size_t(BT) * 3 * C * f);
  k.attention_backward(cx, dB_, dA_, a.qkv, a.att, B_, T_, C, cfg_.heads);
  // qkv = qkv(ln1)
  k.memset_zero(cx, dA_, std::size_t(BT) * C * f);
  linear_backward(dA_, dB_, a.ln1, t(kQkvW), t(kQkvB), BT, C, 3 * C);
  // ln1 = layernorm(x): adds into d(x)
  k.layernorm_backward(cx, dx, G(t(kLn1W)), G(t(kLn1B)), dA_, x, P(t(kLn1W)), a.ln1_mean, a.ln1_rstd, BT, C);
}

void Gpt::segment_forward(int s, bool save_next) {
  const int first = s * ci_, last = std::min(cfg_.layers, first + ci_);
  for (int l = first; l < last; ++l) block_forward(l);
  // keep the next segment's input: it is all backward will have of this segment's activations
  if (save_next && s + 1 < segments_)
    be_.ops().copy_d2d_async(be_.ctx(), 0, ckpt_[std::size_t(s + 1)], ws_[std::size_t((last - 1) % ci_)].res3,
                             std::size_t(B_) * T_ * cfg_.hidden * sizeof(float));
}

void Gpt::forward() {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden, V = cfg_.vocab;
  // encoded (B, T, C) = wte[tokens] + wpe[t]: the first segment's checkpoint
  k.encoder_forward(cx, ckpt_[0], tokens_, P(0), P(1), B_, T_, C);
  for (int s = 0; s < segments_; ++s) segment_forward(s, true);
  const float* xf = ws_[std::size_t((cfg_.layers - 1) % ci_)].res3;
  const std::size_t lnf = tensors_.size() - 2;
  k.layernorm_forward(cx, lnf_, lnf_mean_, lnf_rstd_, xf, P(lnf), P(lnf + 1), BT, C);
  // logits (BT, V) = lnf (BT, C) . wte^T: the LM head tied to the token embedding
  k.gemm(cx, false, true, BT, V, C, 1.0f, lnf_, C, 0, P(0), C, 0, 0.0f, logits_, V, 0, 1);
  k.crossentropy_forward(cx, probs_, losses_, logits_, targets_, BT, V);
}

float Gpt::loss() {
  const std::size_t BT = std::size_t(B_) * T_;
  std::vector<float> l(BT);
  be_.ops().copy_d2h_async(be_.ctx(), 0, l.data(), losses_, BT * sizeof(float));
  be_.ops().synchronize(be_.ctx());
  double s = 0;  // summed in double on the host: the mean does not depend on a kernel's order
  for (float v : l) s += v;
  return float(s / double(BT));
}

const float* Gpt::logits() const { return logits_; }

void Gpt::zero_grad() {
  be_.ops().memset_zero(be_.ctx(), grads_, num_params_ * sizeof(float));
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (group_grads_[g] != grads_ + groups_[g].offset)
      be_.ops().memset_zero(be_.ctx(), group_grads_[g], groups_[g].elems * sizeof(float));
}

void Gpt::backward() {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden, V = cfg_.vocab;
  const std::size_t f = sizeof(float);
  // loss = mean(losses): dlosses = 1 / BT; dlogits into the logits buffer
  float* dlogits = logits_;
  k.memset_zero(cx, dlogits, std::size_t(BT) * V * f);
  k.crossentropy_backward(cx, dlogits, probs_, targets_, 1.0f / float(BT), BT, V);
  // logits = lnf . wte^T: dlnf += dlogits . wte; dwte += dlogits^T . lnf
  k.memset_zero(cx, dA_, std::size_t(BT) * C * f);
  k.gemm(cx, false, false, BT, C, V, 1.0f, dlogits, V, 0, P(0), C, 0, 1.0f, dA_, C, 0, 1);
  k.gemm(cx, true, false, V, C, BT, 1.0f, dlogits, V, 0, lnf_, C, 0, 1.0f, G(0), C, 0, 1);
  // lnf = layernorm(x_L)
  const std::size_t lnf = tensors_.size() - 2;
  const float* xf = ws_[std::size_t((cfg_.layers - 1) % ci_)].res3;
  k.memset_zero(cx, dx_, std::size_t(BT) * C * f);
  k.layernorm_backward(cx, dx_, G(lnf), G(lnf + 1), dA_, xf, P(lnf), lnf_mean_, lnf_rstd_, BT, C);
  for (int s = segments_ - 1; s >= 0; --s) {
    // the last segment's activations are still in the workspace; earlier ones are recomputed
    if (s != segments_ - 1) segment_forward(s, false);
    const int first = s * ci_, last = std::min(cfg_.layers, first + ci_);
    for (int l = last - 1; l >= first; --l) block_backward(l, dx_);
  }
  // encoded = wte[tokens] + wpe[t]
  k.encoder_backward(cx, G(0), G(1), dx_, tokens_, B_, T_, C);
}

}  // namespace memwall::exec
