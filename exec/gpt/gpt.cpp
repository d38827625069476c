// GPT operators on a Backend. Each operator's forward is one kernel (or a GEMM and a bias); each
// backward quotes the forward line it differentiates.
#include "exec/gpt/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace memwall::exec {

GptConfig gpt_config(const ModelSpec& m) {
  GptConfig g;
  g.layers = m.layers;
  g.hidden = int(m.hidden);
  g.heads = m.heads;
  g.max_seq = int(m.seq);
  g.vocab = int(m.vocab);
  g.kv_heads = m.kv_heads;
  g.head_size = int(m.head_size);
  g.ffn = m.ffn;
  g.intermediate = int(m.intermediate);
  g.norm = m.norm;
  g.positions = m.positions;
  g.tied_embeddings = m.tied_embeddings;
  g.bias = m.bias;
  return g;
}

GptConfig mp_slice(const GptConfig& whole, int mp, int rank) {
  if (mp <= 1) return whole;
  GptConfig g = whole;
  g.head_size = whole.head_dim();
  g.heads = whole.heads / mp;
  g.kv_heads = whole.kv() / mp;
  g.intermediate = whole.ffn_size() / mp;
  g.mp = mp;
  g.mp_rank = rank;
  return g;
}

Result<bool> check_mp_slicing(const GptConfig& whole, int mp) {
  if (mp <= 1) return true;
  const auto bad = [&](const char* what, int n) {
    return make_error("--mp: " + std::to_string(mp) + " tensor-slicing ranks must divide the model's " + what + " (" +
                      std::to_string(n) + ")");
  };
  if (whole.heads % mp != 0) return bad("heads", whole.heads);
  if (whole.kv() % mp != 0) return bad("key/value heads", whole.kv());
  if (whole.ffn_size() % mp != 0) return bad("feed-forward size", whole.ffn_size());
  return true;
}

ModelSpec gpt_model_spec(const GptConfig& g) {
  ModelSpec m;
  m.name = "gpt";
  m.source = "run config";
  m.layers = g.layers;
  m.hidden = g.hidden;
  m.heads = g.heads;
  m.seq = g.max_seq;
  m.vocab = g.vocab;
  m.kv_heads = g.kv_heads;
  m.head_size = g.head_size;
  m.ffn = g.ffn;
  m.intermediate = g.intermediate;
  m.norm = g.norm;
  m.positions = g.positions;
  m.tied_embeddings = g.tied_embeddings;
  m.bias = g.bias;
  return m;
}

Result<bool> executor_trains(const ModelSpec& m) {
  const std::string plans = ", which memwall plans and simulates but does not train yet";
  if (m.is_moe())
    return make_error("moe: the executor has no router or expert dispatch: a mixture of experts (" + m.kind_words() +
                      ")" + plans);
  if (m.attention_window > 0 && m.attention_window < m.seq)
    return make_error("attention_window: the executor's attention is causal over the whole sequence; a window of " +
                      std::to_string(m.attention_window) + " keys is sliding-window attention" + plans);
  if (m.positions == PositionKind::rotary && m.head_dim() % 2 != 0)
    return make_error("positions: rotary positions turn channel pairs, so the head size must be even, got " +
                      std::to_string(m.head_dim()));
  if (m.ffn_size() > (1L << 30) || m.hidden > (1L << 20))
    return make_error("intermediate: the executor's kernels index (B, T, I) in 32 bits; got hidden " +
                      std::to_string(m.hidden) + ", intermediate " + std::to_string(m.ffn_size()));
  return true;
}

std::vector<ParamTensor> gpt_param_tensors(const GptConfig& c) {
  const ModelSpec spec = gpt_model_spec(c);
  const long C = c.hidden, V = c.vocab;
  const bool shift = c.norm == NormKind::layernorm;  // RMSNorm scales only
  std::vector<ParamTensor> t;
  std::size_t off = 0;
  auto add = [&](std::string name, std::vector<long> shape) {
    std::size_t n = 1;
    for (long s : shape) n *= std::size_t(s);
    t.push_back({std::move(name), std::move(shape), off, n});
    off += n;
  };
  auto norm = [&](const std::string& name) {
    add(name + ".weight", {C});
    if (shift) add(name + ".bias", {C});
  };
  add("embed.wte", {V, C});
  if (c.positions == PositionKind::learned) add("embed.wpe", {c.max_seq, C});
  // the block's parameters as the operator graph lists them (model/operator_graph.hpp)
  const BlockParamOps ops = block_param_ops(spec);
  for (int l = 0; l < c.layers; ++l)
    for (const BlockParamOp& op : ops) {
      const std::string name = op_name(op.role, l);
      if (!op.linear) {
        norm(name);
        continue;
      }
      add(name + ".weight", {op.out, op.in});
      if (op.bias > 0) add(name + ".bias", {op.out});
    }
  norm("ln_f");
  if (!c.tied_embeddings) add("lm_head.weight", {V, C});
  return t;
}

std::vector<ParamGroup> gpt_param_groups(const GptConfig& c) {
  std::vector<ParamGroup> groups;
  for (const ParamTensor& t : gpt_param_tensors(c)) {
    const std::string g = t.name.substr(0, t.name.rfind('.'));
    if (groups.empty() || groups.back().name != g) {
      ParamGroup pg{g, t.offset, 0};
      if (t.name.ends_with(".weight") && t.shape.size() == 2 && g != "lm_head") {
        pg.linear = true;
        pg.out_features = t.shape[0];
        pg.in_features = t.shape[1];
        pg.row_parallel = g.ends_with(".proj") || g.ends_with(".fc2");
      }
      groups.push_back(pg);
    }
    groups.back().elems += t.elems;
    if (t.name.ends_with(".bias")) groups.back().bias = true;
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
// A slice's tensor (GptConfig::mp > 1) reads the whole tensor at the element it slices: its rows
// are runs of the whole's rows (`rows`: (count, first whole row), in order; qkv: the q, k and v
// heads of the slice; fc1: its gate and up rows), or its columns one run of the whole's (proj, fc2).
struct SliceMap {
  std::vector<std::pair<std::size_t, std::size_t>> rows;  // empty: rows as they are
  std::size_t row_len = 1;                                // elements per row (1: a bias)
  std::size_t cols = 0, whole_cols = 0, col0 = 0;         // cols > 0: a column run
  std::size_t whole_index(std::size_t i) const {
    if (cols > 0) return (i / cols) * whole_cols + col0 + i % cols;
    if (rows.empty()) return i;
    std::size_t r = i / row_len;
    for (const auto& [n, first] : rows) {
      if (r < n) return (first + r) * row_len + i % row_len;
      r -= n;
    }
    return i;
  }
};
struct TensorInit {
  std::size_t elems;
  enum Kind { one, zero, normal } kind;
  double std_dev;
  std::uint64_t key;
  SliceMap map;
};

SliceMap slice_map(const GptConfig& c, const std::string& name) {
  SliceMap m;
  if (c.mp <= 1) return m;
  const std::size_t r = std::size_t(c.mp_rank), mp = std::size_t(c.mp), C = std::size_t(c.hidden);
  const bool weight = name.ends_with(".weight");
  if (name.ends_with("qkv.weight") || name.ends_with("qkv.bias")) {
    const std::size_t A = std::size_t(c.attention_width()), KV = std::size_t(c.kv()) * std::size_t(c.head_dim());
    m.rows = {{A, r * A}, {KV, mp * A + r * KV}, {KV, mp * A + mp * KV + r * KV}};
    m.row_len = weight ? C : 1;
  } else if (name.ends_with("fc1.weight") || name.ends_with("fc1.bias")) {
    const std::size_t I = std::size_t(c.ffn_size());
    m.rows = {{I, r * I}};
    if (c.gated()) m.rows.push_back({I, mp * I + r * I});
    m.row_len = weight ? C : 1;
  } else if (name.ends_with("proj.weight") || name.ends_with("fc2.weight")) {
    m.cols = std::size_t(name.ends_with("proj.weight") ? c.attention_width() : c.ffn_size());
    m.whole_cols = m.cols * mp;
    m.col0 = r * m.cols;
  }
  return m;
}
std::vector<TensorInit> tensor_inits(const GptConfig& c, const ParamGroup& g) {
  std::vector<TensorInit> out;
  for (const ParamTensor& t : gpt_param_tensors(c)) {
    if (t.offset < g.offset || t.offset >= g.offset + g.elems) continue;
    const bool ln_weight = t.name.ends_with("ln1.weight") || t.name.ends_with("ln2.weight") || t.name == "ln_f.weight";
    const bool resid = t.name.ends_with("proj.weight") || t.name.ends_with("fc2.weight");
    const TensorInit::Kind kind = ln_weight                     ? TensorInit::one
                                  : t.name.ends_with(".bias") ? TensorInit::zero
                                                              : TensorInit::normal;
    out.push_back({t.elems, kind, resid ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02, name_key(t.name), slice_map(c, t.name)});
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
      case TensorInit::normal: return float(t.std_dev * normal_at(t.key, t.map.whole_index(at)));
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
  const std::size_t OCt = tiled ? OC / std::size_t(tiles) : OC, per_tile = OCt * (IC + (g.bias ? 1 : 0));
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

std::vector<std::size_t> gpt_slice_indices(const GptConfig& slice) {
  GptConfig whole = slice;
  whole.heads = slice.heads * slice.mp;
  whole.kv_heads = slice.kv() * slice.mp;
  whole.intermediate = slice.ffn_size() * slice.mp;
  whole.mp = 1;
  whole.mp_rank = 0;
  std::vector<std::size_t> at_whole;
  for (const ParamTensor& t : gpt_param_tensors(whole)) at_whole.push_back(t.offset);
  std::vector<std::size_t> out;
  std::size_t k = 0;
  for (const ParamTensor& t : gpt_param_tensors(slice)) {  // the same tensors, in the same order
    const SliceMap m = slice_map(slice, t.name);
    for (std::size_t i = 0; i < t.elems; ++i) out.push_back(at_whole[k] + m.whole_index(i));
    ++k;
  }
  return out;
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
    const std::size_t tile_at = t * OCt * (IC + (g.bias ? 1 : 0));  // [W_t (OCt, IC), b_t (OCt)]
    for (std::size_t r = 0; r < OCt * IC; ++r) {
      const std::size_t flat = t * OCt * IC + r, tiled = tile_at + r;
      (kToTiles ? out[tiled] : out[flat]) = kToTiles ? in[flat] : in[tiled];
    }
    for (std::size_t r = 0; g.bias && r < OCt; ++r) {
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
  // gpt_param_groups' order: embed, then per block the operator graph's block_param_ops, then
  // ln_f, then an untied lm_head
  const BlockParamOps ops = block_param_ops(gpt_model_spec(cfg));
  const int per_block = int(ops.size()), after_blocks = 1 + per_block * cfg.layers;
  switch (kind) {
    case OpKind::embed: return 0;
    case OpKind::lm_head: return cfg.tied_embeddings ? 0 : after_blocks + 1;
    case OpKind::ln_f: return after_blocks;
    default: break;
  }
  if (block < 0 || block >= cfg.layers) return -1;
  for (int i = 0; i < per_block; ++i)
    if (ops[std::size_t(i)].role == kind) return 1 + per_block * block + i;
  return -1;
}

// ---- workspace -------------------------------------------------------------------------------

struct GptOps::Layout {
  std::size_t BT, C, V, NH, T, A, QW, I, F1;  // F1: fc1's outputs, I or (gated) 2I
  int ci, mbs;
  std::size_t staging = 0;  // floats

  Layout(const GptConfig& c, int B, int T_, int ci_, int mbs_, int tiles)
      : BT(std::size_t(B) * T_), C(std::size_t(c.hidden)), V(std::size_t(c.vocab)), NH(std::size_t(c.heads)),
        T(std::size_t(T_)), A(std::size_t(c.attention_width())), QW(std::size_t(c.qkv_width())), I(std::size_t(c.ffn_size())),
        F1(std::size_t(c.gated() ? 2 : 1) * I), ci(std::max(1, std::min(ci_, c.layers))), mbs(mbs_) {
    for (const ParamGroup& g : gpt_param_groups(c))
      staging = std::max(staging, g.linear ? g.elems / std::size_t(std::max(1, tiles)) : g.elems);
  }
  std::size_t att() const { return BT / T * NH * T * T; }  // (B, NH, T, T)

  // Walks every buffer in a fixed order; `take(floats)` returns where it goes (or counts it).
  template <typename Take>
  void carve(std::vector<MicroBatch>& mb, float*& wstage, float*& gstage, std::vector<float*>& io, int chunks,
             Take take) const {
    wstage = take(staging);
    gstage = take(staging);
    io.assign(4 * std::size_t(std::max(0, chunks)), nullptr);
    for (float*& p : io) p = take(BT * C);
    mb.resize(std::size_t(mbs));
    for (MicroBatch& m : mb) {
      m.tokens = reinterpret_cast<int*>(take(BT));
      m.targets = reinterpret_cast<int*>(take(BT));
      m.stream[0] = take(BT * C);
      m.stream[1] = take(BT * C);
      m.segment_input = nullptr;
      m.lnf = take(BT * C), m.lnf_mean = take(BT), m.lnf_rstd = take(BT);
      m.logits = take(BT * V), m.probs = take(BT * V), m.dlogits = take(BT * V), m.losses = take(BT);
      m.dx = take(BT * C);
      if (&m != &mb.front()) {  // l2l runs one micro-batch through a block (or segment) at a time
        m.ws = mb.front().ws;
        m.dA = mb.front().dA, m.dB = mb.front().dB, m.dC = mb.front().dC, m.datt = mb.front().datt;
        continue;
      }
      m.ws.resize(std::size_t(ci));
      for (BlockActs& a : m.ws) {
        a.ln1 = take(BT * C), a.ln1_mean = take(BT), a.ln1_rstd = take(BT), a.qkv = take(BT * QW);
        a.att = take(att()), a.atty = take(BT * A), a.attproj = take(BT * C), a.res2 = take(BT * C);
        a.ln2 = take(BT * C), a.ln2_mean = take(BT), a.ln2_rstd = take(BT), a.fch = take(BT * F1);
        a.fch_gelu = take(BT * I), a.fcproj = take(BT * C), a.res3 = take(BT * C);
      }
      m.dA = take(BT * std::max(C, A)), m.dB = take(BT * std::max(I, QW)), m.dC = take(BT * F1);
      m.datt = take(att());
    }
  }
};

namespace {
constexpr std::size_t kAlign = 256;  // bytes: cudaMalloc's alignment, enough for every kernel
std::size_t aligned(std::size_t floats) { return (floats * sizeof(float) + kAlign - 1) / kAlign * kAlign; }
}  // namespace

std::size_t GptOps::workspace_bytes(const GptConfig& cfg, int B, int T, int ci, int micro_batches, int tiles,
                                    int pipeline_chunks) {
  Layout l(cfg, B, T, ci, micro_batches, tiles);
  std::size_t total = 0;
  std::vector<MicroBatch> mb;
  float *w = nullptr, *g = nullptr;
  std::vector<float*> io;
  l.carve(mb, w, g, io, pipeline_chunks, [&](std::size_t n) -> float* {
    total += aligned(n);
    return nullptr;
  });
  return total;
}

Result<std::unique_ptr<GptOps>> GptOps::create(Backend& backend, const GptConfig& cfg, int B, int T, int ci,
                                               int micro_batches, int tiles, void* workspace, std::size_t bytes,
                                               int pipeline_chunks) {
  if (cfg.layers < 1 || cfg.hidden < 1 || cfg.heads < 1 || cfg.hidden % cfg.heads != 0)
    return make_error("hidden (" + std::to_string(cfg.hidden) + ") must be a positive multiple of heads (" +
                      std::to_string(cfg.heads) + ")");
  if (cfg.kv_heads < 0 || cfg.heads % cfg.kv() != 0)
    return make_error("kv_heads (" + std::to_string(cfg.kv_heads) + ") must divide heads (" +
                      std::to_string(cfg.heads) + ")");
  if (cfg.intermediate < 0) return make_error("intermediate must be >= 0, got " + std::to_string(cfg.intermediate));
  if (Result<bool> ok = executor_trains(gpt_model_spec(cfg)); !ok) return make_error(ok.error());
  if (T < 1 || T > cfg.max_seq || B < 1 || micro_batches < 1)
    return make_error("seq must be between 1 and the model's " + std::to_string(cfg.max_seq) + ", bsz >= 1");
  for (const ParamGroup& g : gpt_param_groups(cfg))
    if (g.linear && tiles > 1 && g.out_features % tiles != 0)
      return make_error("tiling " + std::to_string(tiles) + " must divide the output features of every linear layer (" +
                        g.name + " has " + std::to_string(g.out_features) + ")");
  const std::size_t need = workspace_bytes(cfg, B, T, ci, micro_batches, tiles, pipeline_chunks);
  if (bytes < need || reinterpret_cast<std::uintptr_t>(workspace) % kAlign != 0)
    return make_error("GPT workspace: " + std::to_string(need) + " bytes aligned to " + std::to_string(kAlign) +
                      " needed, got " + std::to_string(bytes));
  std::unique_ptr<GptOps> g(new GptOps(backend, cfg, B, T, std::max(1, std::min(ci, cfg.layers)), micro_batches));
  g->role_bias_.assign(std::size_t(OpKind::router) + 1, false);
  for (const BlockParamOp& op : block_param_ops(gpt_model_spec(cfg))) g->role_bias_[std::size_t(op.role)] = op.bias > 0;
  Layout l(cfg, B, T, ci, micro_batches, tiles);
  char* at = static_cast<char*>(workspace);
  l.carve(g->mb_, g->weight_staging_, g->grad_staging_, g->io_, pipeline_chunks, [&](std::size_t n) {
    float* p = reinterpret_cast<float*>(at);
    at += aligned(n);
    return p;
  });
  g->staging_elems_ = l.staging;
  return g;
}

// ---- operators -------------------------------------------------------------------------------

const float* GptOps::block_input(int b, int u) const { return block_in(b, u, false); }

const float* GptOps::block_in(int b, int u, bool recompute) const {
  const MicroBatch& m = mb_[std::size_t(u)];
  // a chunk after the pipeline's first: what it received
  if (!recompute) return staged() && b == first_of(b) && b > 0 ? io_[4 * std::size_t(chunk_of(b))] : m.stream[b % 2];
  const int rel = b - first_of(b);
  if (rel % ci_ == 0) return m.segment_input;                  // the loaded checkpoint
  return m.ws[std::size_t((rel - 1) % ci_)].res3;              // the previous block of the segment
}

float* GptOps::block_out(int b, int u, bool recompute) {
  MicroBatch& m = mb_[std::size_t(u)];
  if (recompute) return m.ws[std::size_t((b - first_of(b)) % ci_)].res3;
  // a chunk before the pipeline's last: to the stage after
  if (staged() && b == last_of(b) - 1 && b != cfg_.layers - 1) return io_[4 * std::size_t(chunk_of(b)) + 1];
  return m.stream[(b + 1) % 2];
}

int GptOps::chunk_of(int b) const {
  for (std::size_t k = 0; k < chunks_.size(); ++k)
    if (b >= chunks_[k].first && b < chunks_[k].last) return int(k);
  return 0;
}

void GptOps::take_stage_grad(int u, int k) {
  be_.ops().copy_d2d_async(be_.ctx(), 0, mb_[std::size_t(u)].dx, stage_grad_input(k),
                           std::size_t(B_) * T_ * cfg_.hidden * sizeof(float));
}
void GptOps::give_stage_grad(int u, int k) {
  be_.ops().copy_d2d_async(be_.ctx(), 0, stage_grad_output(k), mb_[std::size_t(u)].dx,
                           std::size_t(B_) * T_ * cfg_.hidden * sizeof(float));
}

// A linear operator, or one tile of its output columns: out (BT, OC) columns [o0, o0 + OCt).
void GptOps::linear_forward(const OpCall& c, float* out, const float* inp, long IC, long OC) {
  const int BT = B_ * T_;
  const long OCt = OC / c.tiles, o0 = c.tile < 0 ? 0 : c.tile * OCt;
  const float* W = c.params;          // (OCt, IC)
  const float* bias = W + OCt * IC;   // (OCt), if the layer has one
  // out[:, o0:o0+OCt] = inp (BT, IC) . W^T; then += bias
  be_.ops().gemm(be_.ctx(), false, true, BT, int(OCt), int(IC), 1.0f, inp, int(IC), 0, W, int(IC), 0, 0.0f, out + o0,
                 int(OC), 0, 1);
  // a row-parallel layer's partial sums meet in the all-reduce: one slice adds the bias
  const bool row_parallel = c.op.kind == OpKind::proj || c.op.kind == OpKind::fc2;
  if (has_bias(c) && !(row_parallel && cfg_.mp_rank != 0))
    be_.ops().bias_forward(be_.ctx(), out + o0, bias, BT, int(OCt), int(OC));
}

float* GptOps::mp_partial_sums(OpKind kind, int block, bool backward, int u) {
  if (!backward && kind == OpKind::proj) return acts(block, u).attproj;
  if (!backward && kind == OpKind::fc2) return acts(block, u).fcproj;
  if (backward && (kind == OpKind::qkv || kind == OpKind::fc1)) return mb_[std::size_t(u)].dA;
  throw std::logic_error("GptOps: no tensor-slicing all-reduce after " + std::string(to_string(kind)) +
                         (backward ? " in backward" : " in forward"));
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
  if (has_bias(c)) be_.ops().bias_backward(be_.ctx(), dbias, dout + o0, BT, int(OCt), int(OC));
}

bool GptOps::has_bias(const OpCall& c) const { return role_bias_[std::size_t(c.op.kind)]; }

// LayerNorm (scale and shift) or RMSNorm (scale): params = [weight (C), bias (C) if LayerNorm]
void GptOps::norm_forward(const OpCall& c, float* out, float* mean, float* rstd, const float* inp) {
  const int BT = B_ * T_, C = cfg_.hidden;
  if (cfg_.norm == NormKind::rmsnorm) return be_.ops().rmsnorm_forward(be_.ctx(), out, rstd, inp, c.params, BT, C);
  be_.ops().layernorm_forward(be_.ctx(), out, mean, rstd, inp, c.params, c.params + C, BT, C);
}

void GptOps::norm_backward(const OpCall& c, float* dinp, const float* dout, const float* inp, const float* mean,
                           const float* rstd) {
  const int BT = B_ * T_, C = cfg_.hidden;
  if (cfg_.norm == NormKind::rmsnorm)
    return be_.ops().rmsnorm_backward(be_.ctx(), dinp, c.grads, dout, inp, c.params, rstd, BT, C);
  be_.ops().layernorm_backward(be_.ctx(), dinp, c.grads, c.grads + C, dout, inp, c.params, mean, rstd, BT, C);
}

void GptOps::forward(const OpCall& c) {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden, V = cfg_.vocab, NH = cfg_.heads, KVH = cfg_.kv(), I = cfg_.ffn_size();
  const int A = cfg_.attention_width();
  const int b = c.op.block, u = c.micro_batch;
  MicroBatch& m = mb_[std::size_t(u)];
  // the last tile of a linear operator in forward order (tiles run first to last) completes it
  const bool last_part = c.tile < 0 || c.tile == c.tiles - 1;
  switch (c.op.kind) {
    case OpKind::embed: {
      // stream[0] (B, T, C) = wte[tokens] + wpe[t]; wte (V, C) then wpe (maxT, C) in the group
      const float* wpe = cfg_.positions == PositionKind::learned ? c.params + std::size_t(V) * C : nullptr;
      k.encoder_forward(cx, m.stream[0], m.tokens, c.params, wpe, B_, T_, C);
      return;
    }
    case OpKind::ln1: {
      BlockActs& a = acts(b, u);
      norm_forward(c, a.ln1, a.ln1_mean, a.ln1_rstd, block_in(b, u, c.recompute));
      return;
    }
    case OpKind::qkv:
      linear_forward(c, acts(b, u).qkv, acts(b, u).ln1, C, cfg_.qkv_width());
      // rotary: q and k turned by their positions once every tile has written its columns
      if (cfg_.positions == PositionKind::rotary && last_part)
        k.rope(cx, acts(b, u).qkv, B_, T_, A, NH, KVH, float(cfg_.rope_theta), false);
      return;
    case OpKind::attn_scores:
      k.attention_scores_forward(cx, acts(b, u).att, acts(b, u).qkv, B_, T_, A, NH, KVH);
      return;
    case OpKind::attn_context:
      k.attention_context_forward(cx, acts(b, u).atty, acts(b, u).att, acts(b, u).qkv, B_, T_, A, NH, KVH);
      return;
    case OpKind::proj: linear_forward(c, acts(b, u).attproj, acts(b, u).atty, A, C); return;
    case OpKind::residual1:
      k.residual_forward(cx, acts(b, u).res2, block_in(b, u, c.recompute), acts(b, u).attproj, long(BT) * C);
      return;
    case OpKind::ln2: {
      BlockActs& a = acts(b, u);
      norm_forward(c, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2);
      return;
    }
    case OpKind::fc1: linear_forward(c, acts(b, u).fch, acts(b, u).ln2, C, (cfg_.gated() ? 2L : 1L) * I); return;
    case OpKind::gelu:  // the feed-forward's activation: GeLU, or gated, act(gate) * up
      if (cfg_.gated()) k.glu_forward(cx, acts(b, u).fch_gelu, acts(b, u).fch, BT, I, cfg_.ffn == FfnKind::geglu);
      else k.gelu_forward(cx, acts(b, u).fch_gelu, acts(b, u).fch, long(BT) * I);
      return;
    case OpKind::fc2: linear_forward(c, acts(b, u).fcproj, acts(b, u).fch_gelu, I, C); return;
    case OpKind::residual2:
      k.residual_forward(cx, block_out(b, u, c.recompute), acts(b, u).res2, acts(b, u).fcproj, long(BT) * C);
      return;
    case OpKind::ln_f: norm_forward(c, m.lnf, m.lnf_mean, m.lnf_rstd, m.stream[cfg_.layers % 2]); return;
    case OpKind::lm_head:
      // logits (BT, V) = lnf (BT, C) . W^T: W the token embedding (tied) or the head's own (V, C)
      k.gemm(cx, false, true, BT, V, C, 1.0f, m.lnf, C, 0, c.params, C, 0, 0.0f, m.logits, V, 0, 1);
      k.crossentropy_forward(cx, m.probs, m.losses, m.logits, m.targets, BT, V);
      return;
    case OpKind::router:  // a mixture of experts: refused before any step runs (executor_trains)
      throw std::logic_error("GptOps: the executor trains no mixture of experts");
  }
}

void GptOps::backward(const OpCall& c) {
  const BackendOps& k = be_.ops();
  void* cx = be_.ctx();
  const int BT = B_ * T_, C = cfg_.hidden, V = cfg_.vocab, NH = cfg_.heads, KVH = cfg_.kv(), I = cfg_.ffn_size();
  const int A = cfg_.attention_width();
  const int b = c.op.block, u = c.micro_batch;
  const long F1 = (cfg_.gated() ? 2L : 1L) * I;
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
      // logits = lnf . W^T: dlnf (into dA) = dlogits . W; dW += dlogits^T . lnf
      k.memset_zero(cx, m.dA, btc * f);
      k.gemm(cx, false, false, BT, C, V, 1.0f, m.dlogits, V, 0, c.params, C, 0, 1.0f, m.dA, C, 0, 1);
      k.gemm(cx, true, false, V, C, BT, 1.0f, m.dlogits, V, 0, m.lnf, C, 0, 1.0f, c.grads, C, 0, 1);
      return;
    case OpKind::ln_f:
      // lnf = norm(x_L): dx = d(x_L)
      k.memset_zero(cx, m.dx, btc * f);
      norm_backward(c, m.dx, m.dA, m.stream[cfg_.layers % 2], m.lnf_mean, m.lnf_rstd);
      return;
    case OpKind::residual2:  // res3 = res2 + fcproj: d(res2) = d(fcproj) = dx, so dx carries on as d(res2)
    case OpKind::residual1:  // res2 = x + attproj: d(x) = d(attproj) = dx, so dx carries on as d(x)
      return;
    case OpKind::fc2: {
      // fcproj = fc2(fch_gelu): d(fch_gelu) into dB
      if (first_part) k.memset_zero(cx, m.dB, std::size_t(BT) * std::size_t(I) * f);
      linear_backward(c, m.dB, m.dx, acts(b, u).fch_gelu, I, C);
      return;
    }
    case OpKind::gelu:
      // fch_gelu = gelu(fch), or act(gate) * up: d(fch) into dC
      k.memset_zero(cx, m.dC, std::size_t(BT) * std::size_t(F1) * f);
      if (cfg_.gated()) k.glu_backward(cx, m.dC, acts(b, u).fch, m.dB, BT, I, cfg_.ffn == FfnKind::geglu);
      else k.gelu_backward(cx, m.dC, acts(b, u).fch, m.dB, long(BT) * I);
      return;
    case OpKind::fc1:
      // fch = fc1(ln2): d(ln2) into dA
      if (first_part) k.memset_zero(cx, m.dA, btc * f);
      linear_backward(c, m.dA, m.dC, acts(b, u).ln2, C, F1);
      return;
    case OpKind::ln2: {
      // ln2 = norm(res2): adds into d(res2) = dx
      BlockActs& a = acts(b, u);
      norm_backward(c, m.dx, m.dA, a.res2, a.ln2_mean, a.ln2_rstd);
      return;
    }
    case OpKind::proj:
      // attproj = proj(atty): d(atty) (B, T, A) into dA
      if (first_part) k.memset_zero(cx, m.dA, std::size_t(BT) * std::size_t(A) * f);
      linear_backward(c, m.dA, m.dx, acts(b, u).atty, A, C);
      return;
    case OpKind::attn_context:
      // atty = att . v: d(att) into datt, d(v) into the v part of d(qkv) (dB)
      k.memset_zero(cx, m.datt, std::size_t(B_) * NH * T_ * T_ * f);
      k.memset_zero(cx, m.dB, std::size_t(BT) * std::size_t(cfg_.qkv_width()) * f);
      k.attention_context_backward(cx, m.datt, m.dB, m.dA, acts(b, u).att, acts(b, u).qkv, B_, T_, A, NH, KVH);
      return;
    case OpKind::attn_scores:
      // att = softmax(q . k / sqrt(hs)): d(q), d(k) into d(qkv) (dB)
      k.attention_scores_backward(cx, m.dB, m.datt, acts(b, u).att, acts(b, u).qkv, B_, T_, A, NH, KVH);
      return;
    case OpKind::qkv:
      // rotary: q and k were turned after the projection, so their gradients are turned back first
      if (cfg_.positions == PositionKind::rotary && first_part)
        k.rope(cx, m.dB, B_, T_, A, NH, KVH, float(cfg_.rope_theta), true);
      // qkv = qkv(ln1): d(ln1) into dA
      if (first_part) k.memset_zero(cx, m.dA, btc * f);
      linear_backward(c, m.dA, m.dB, acts(b, u).ln1, C, cfg_.qkv_width());
      return;
    case OpKind::ln1: {
      // ln1 = norm(x): adds into d(x) = dx
      BlockActs& a = acts(b, u);
      norm_backward(c, m.dx, m.dA, block_in(b, u, true), a.ln1_mean, a.ln1_rstd);
      return;
    }
    case OpKind::embed: {
      // stream[0] = wte[tokens] + wpe[t]
      float* dwpe = cfg_.positions == PositionKind::learned ? c.grads + std::size_t(V) * C : nullptr;
      k.encoder_backward(cx, c.grads, dwpe, m.dx, m.tokens, B_, T_, C);
      return;
    }
    case OpKind::router:  // a mixture of experts: refused before any step runs (executor_trains)
      throw std::logic_error("GptOps: the executor trains no mixture of experts");
  }
}

}  // namespace memwall::exec
