#include "exec/gpt/train.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/units.hpp"
#include "model/yaml_reader.hpp"

#ifndef MEMWALL_SOURCE_DIR
#define MEMWALL_SOURCE_DIR "."
#endif

namespace memwall::exec {

std::string default_corpus_path() { return std::string(MEMWALL_SOURCE_DIR) + "/exec/data/corpus.txt"; }

namespace {

double positive_real(const YamlReader& r, const YAML::Node& root, const std::string& key, double fallback, bool zero_ok) {
  YAML::Node n = root[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  const std::string expected = zero_ok ? "a number >= 0, such as 0.01" : "a number > 0, such as 3e-4";
  if (!n.IsScalar()) r.fail(n, key, "expected " + expected);
  const std::string s = n.Scalar();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || (v == 0 && !zero_ok))
    r.fail(n, key, "expected " + expected + ", got \"" + s + "\"");
  return v;
}

int bounded(const YamlReader& r, const YAML::Node& root, const std::string& key, long lo, long hi, long fallback) {
  const long v = r.integer_or(root, "", key, lo, fallback);
  if (v > hi) r.fail(root[key], key, "expected at most " + std::to_string(hi) + ", got " + std::to_string(v));
  return int(v);
}

}  // namespace

Result<RunConfig> parse_run_config(const std::string& source, std::string_view text) {
  try {
    YamlReader r(source, text);
    const YAML::Node& root = r.root();
    if (!root.IsMap()) r.fail(root, "", "expected a mapping of run settings (layers, hidden, heads, steps, ...)");
    r.only_keys(root, "", {"layers", "hidden", "heads", "steps", "bsz", "seq", "ci", "lr", "weight_decay", "seed",
                           "backend", "compute", "capacity", "corpus"});
    RunConfig c;
    c.model.layers = bounded(r, root, "layers", 1, 1000, c.model.layers);
    c.model.hidden = bounded(r, root, "hidden", 1, 1 << 16, c.model.hidden);
    c.model.heads = bounded(r, root, "heads", 1, 1024, c.model.heads);
    if (c.model.hidden % c.model.heads != 0)
      r.fail(root["hidden"].IsDefined() ? root["hidden"] : root, "hidden",
             "expected a multiple of heads (" + std::to_string(c.model.heads) + "), got " +
                 std::to_string(c.model.hidden));
    c.steps = bounded(r, root, "steps", 1, 100000000, c.steps);
    c.bsz = bounded(r, root, "bsz", 1, 1 << 20, c.bsz);
    c.seq = bounded(r, root, "seq", 1, 1 << 20, c.seq);
    c.model.max_seq = c.seq;
    c.ci = bounded(r, root, "ci", 0, c.model.layers, c.ci);
    c.lr = positive_real(r, root, "lr", c.lr, false);
    c.weight_decay = positive_real(r, root, "weight_decay", c.weight_decay, true);
    c.seed = std::uint64_t(r.integer_or(root, "", "seed", 0, long(c.seed)));
    c.backend = r.text_or(root, "", "backend", c.backend);
    if (c.backend != "cpu" && c.backend != "cuda")
      r.fail(root["backend"], "backend", "expected cpu or cuda, got \"" + c.backend + "\"");
    const std::string compute = r.text_or(root, "", "compute", "fp32");
    Result<ComputeType> ct = parse_compute_type(compute);
    if (!ct) r.fail(root["compute"], "compute", ct.error());
    c.compute = *ct;
    c.capacity_bytes = std::size_t(r.quantity_or(root, "", "capacity", Dimension::bytes, 0.0));
    c.corpus = r.text_or(root, "", "corpus", "");
    if (c.corpus.empty()) {
      c.corpus = default_corpus_path();
    } else if (std::filesystem::path(c.corpus).is_relative()) {
      c.corpus = (std::filesystem::path(source).parent_path() / c.corpus).string();
    }
    if (!std::filesystem::is_regular_file(c.corpus))
      r.fail(root["corpus"].IsDefined() ? root["corpus"] : root, "corpus", "no such file: " + c.corpus);
    return c;
  } catch (const InputError& e) {
    return make_error(e.what());
  }
}

Result<RunConfig> load_run_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(path + ": cannot read the run config");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_run_config(path, ss.str());
}

Result<Corpus> Corpus::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot read the corpus");
  Corpus c;
  c.data_.assign(std::istreambuf_iterator<char>(in), {});
  if (c.data_.size() < 2) return make_error(path + ": the corpus needs at least 2 bytes");
  return c;
}

void Corpus::next_batch(int B, int T, std::uint64_t& rng, std::vector<int>& tokens, std::vector<int>& targets) const {
  tokens.resize(std::size_t(B) * T);
  targets.resize(std::size_t(B) * T);
  const std::size_t span = data_.size() > std::size_t(T) ? data_.size() - std::size_t(T) : 1;
  for (int b = 0; b < B; ++b) {
    std::uint64_t z = (rng += 0x9E3779B97F4A7C15ull);  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    const std::size_t start = std::size_t((z ^ (z >> 31)) % span);
    for (int t = 0; t < T; ++t) {
      // a corpus shorter than T + 1 wraps around
      tokens[std::size_t(b) * T + t] = data_[(start + t) % data_.size()];
      targets[std::size_t(b) * T + t] = data_[(start + t + 1) % data_.size()];
    }
  }
}

std::string memory_shortfall(const RunConfig& cfg, const GptMemory& need, std::size_t capacity_bytes) {
  if (need.total() <= capacity_bytes) return "";
  std::ostringstream s;
  s << "the model needs " << need.total() << " bytes (" << format_bytes(double(need.total()))
    << ") of " << cfg.backend << " device memory (parameters " << format_bytes(double(need.params_bytes))
    << ", gradients " << format_bytes(double(need.grads_bytes)) << ", activations "
    << format_bytes(double(need.activations_bytes)) << ", checkpoints " << format_bytes(double(need.checkpoints_bytes))
    << ", scratch " << format_bytes(double(need.scratch_bytes)) << "), but " << capacity_bytes << " bytes ("
    << format_bytes(double(capacity_bytes)) << ") are available";
  return s.str();
}

Result<std::unique_ptr<Trainer>> Trainer::create(const RunConfig& cfg) {
  std::unique_ptr<Trainer> t(new Trainer);
  t->cfg_ = cfg;
  BackendOptions bo;
  bo.capacity_bytes = cfg.capacity_bytes;
  bo.compute = cfg.compute;
  Result<std::unique_ptr<Backend>> be = create_backend(cfg.backend, bo);
  if (!be) return make_error("backend: " + be.error());
  t->backend_ = std::move(be).value();
  const GptMemory need = gpt_memory(cfg.model, cfg.bsz, cfg.seq, cfg.ci);
  const std::string shortfall = memory_shortfall(cfg, need, t->backend_->caps().capacity_bytes);
  if (!shortfall.empty()) return make_error(shortfall);
  Result<std::unique_ptr<Gpt>> g = Gpt::create(*t->backend_, cfg.model, cfg.bsz, cfg.seq, cfg.ci);
  if (!g) return make_error(g.error());
  t->gpt_ = std::move(g).value();
  adam::AdamOptions ao;
  ao.lr = cfg.lr;
  ao.weight_decay = cfg.weight_decay;
  ao.decoupled_weight_decay = true;
  Result<adam::CpuAdam> a = adam::CpuAdam::create(ao);
  if (!a) return make_error("adam: " + a.error());
  t->adam_ = std::make_unique<adam::CpuAdam>(std::move(a).value());
  const BackendOps& k = t->backend_->ops();
  Result<Stream> s = k.stream_create(t->backend_->ctx());
  if (!s) return make_error(s.error());
  t->copy_ = *s;
  t->ev_ready_ = k.event_create(t->backend_->ctx());
  t->ev_grads_ = k.event_create(t->backend_->ctx());
  const std::size_t n = t->gpt_->num_params();
  t->master_ = gpt_init_params(cfg.model, cfg.seed);
  t->m_.assign(n, 0.0f);
  t->v_.assign(n, 0.0f);
  t->grads_.assign(n, 0.0f);
  t->upload_params();
  return t;
}

Trainer::~Trainer() {
  if (!backend_) return;
  backend_->ops().synchronize(backend_->ctx());
  if (ev_ready_) backend_->ops().event_destroy(backend_->ctx(), ev_ready_);
  if (ev_grads_) backend_->ops().event_destroy(backend_->ctx(), ev_grads_);
  gpt_.reset();  // frees its device memory before the backend goes
}

void Trainer::upload_params() {
  const BackendOps& k = backend_->ops();
  void* cx = backend_->ctx();
  // the compute stream must be done with the old parameters before the copy overwrites them
  k.event_record(cx, ev_grads_, 0);
  k.stream_wait_event(cx, copy_, ev_grads_);
  k.copy_h2d_async(cx, copy_, gpt_->params(), master_.data(), master_.size() * sizeof(float));
  k.event_record(cx, ev_ready_, copy_);
  k.stream_wait_event(cx, 0, ev_ready_);
}

Result<float> Trainer::step(const std::vector<int>& tokens, const std::vector<int>& targets) {
  const std::size_t BT = std::size_t(cfg_.bsz) * cfg_.seq;
  if (tokens.size() != BT || targets.size() != BT)
    return make_error("step: expected " + std::to_string(BT) + " tokens and targets");
  const BackendOps& k = backend_->ops();
  void* cx = backend_->ctx();
  // batch in on the copy stream; compute waits for it (and for the parameters uploaded before)
  k.event_synchronize(cx, ev_ready_);  // the previous upload has finished reading tokens_
  tokens_ = tokens;
  targets_ = targets;
  k.copy_h2d_async(cx, copy_, gpt_->tokens(), tokens_.data(), BT * sizeof(int));
  k.copy_h2d_async(cx, copy_, gpt_->targets(), targets_.data(), BT * sizeof(int));
  k.event_record(cx, ev_ready_, copy_);
  k.stream_wait_event(cx, 0, ev_ready_);

  gpt_->zero_grad();
  gpt_->forward();
  gpt_->backward();
  // gradients out on the copy stream once backward is done, then Adam on the host
  k.event_record(cx, ev_grads_, 0);
  k.stream_wait_event(cx, copy_, ev_grads_);
  k.copy_d2h_async(cx, copy_, grads_.data(), gpt_->grads(), grads_.size() * sizeof(float));
  k.event_record(cx, ev_grads_, copy_);
  const float loss = gpt_->loss();
  k.event_synchronize(cx, ev_grads_);
  if (k.sticky_error)
    if (const char* e = k.sticky_error(cx)) return make_error(std::string(backend_->caps().name) + ": " + e);

  adam::AdamChunk chunk;
  chunk.param = master_.data();
  chunk.exp_avg = m_.data();
  chunk.exp_avg_sq = v_.data();
  chunk.grad = grads_.data();
  chunk.n = master_.size();
  Result<std::size_t> done = adam_->step(chunk, ++step_);
  if (!done) return make_error("adam: " + done.error());
  upload_params();
  return loss;
}

}  // namespace memwall::exec
