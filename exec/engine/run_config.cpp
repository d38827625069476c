#include "exec/engine/run_config.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "exec/adam/cpu_adam.hpp"
#include "model/training_config.hpp"
#include "model/units.hpp"
#include "model/yaml_reader.hpp"

namespace memwall::exec {

namespace {

// A rate such as lr or weight_decay: finite, above 0 (or 0 when `zero_ok`), at most `most` (an lr
// of 1e308 trains to NaN in one step).
double positive_real(const YamlReader& r, const YAML::Node& root, const std::string& key, double fallback, bool zero_ok,
                     double most) {
  YAML::Node n = root[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  const std::string bound = " and at most " + format_g(most);
  const std::string expected =
      zero_ok ? "a number >= 0" + bound + ", such as 0.01" : "a number > 0" + bound + ", such as 3e-4";
  if (!n.IsScalar()) r.fail(n, key, "expected " + expected);
  const std::string s = n.Scalar();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || (v == 0 && !zero_ok) || v > most)
    r.fail(n, key, "expected " + expected + ", got \"" + s + "\"");
  return v;
}

int bounded(const YamlReader& r, const YAML::Node& root, const std::string& key, long lo, long hi, long fallback) {
  return int(r.integer_or(root, "", key, lo, hi, fallback));
}

}  // namespace

Result<RunConfig> parse_run_config(const std::string& source, std::string_view text) {
  try {
    YamlReader r(source, text);
    const YAML::Node& root = r.root();
    if (!root.IsMap()) r.fail(root, "", "expected a mapping of run settings (layers, hidden, heads, steps, ...)");
    std::vector<std::string> keys = {"layers", "hidden", "heads", "steps", "bsz", "seq", "ci", "lr", "lr_schedule",
                                     "warmup_steps", "decay_steps", "min_lr", "weight_decay", "grad_clip", "seed", "backend",
                                     "compute", "precision", "capacity", "corpus", "rope_theta"};
    keys.insert(keys.end(), model_kind_fields().begin(), model_kind_fields().end());  // kv_heads, ffn, ...
    r.only_keys(root, "", keys);
    RunConfig c;
    c.model.layers = bounded(r, root, "layers", 1, 1000, c.model.layers);
    c.model.hidden = bounded(r, root, "hidden", 1, 1 << 16, c.model.hidden);
    c.model.heads = bounded(r, root, "heads", 1, 1024, c.model.heads);
    if (c.model.hidden % c.model.heads != 0)
      r.fail(root["hidden"].IsDefined() ? root["hidden"] : root, "hidden",
             "expected a multiple of heads (" + std::to_string(c.model.heads) + "), got " +
                 std::to_string(c.model.hidden));
    // the block's kind: the model YAML's fields and reader (model/model_spec.hpp), then what the
    // executor trains of them
    ModelSpec kind = gpt_model_spec(c.model);
    read_model_kind(r, root, "", kind);
    c.steps = bounded(r, root, "steps", 1, 100000000, c.steps);
    c.bsz = bounded(r, root, "bsz", 1, 1 << 20, c.bsz);
    c.seq = bounded(r, root, "seq", 1, 1 << 20, c.seq);
    kind.seq = c.seq;
    if (Result<bool> ok = executor_trains(kind); !ok) {
      const std::string field = ok.error().substr(0, ok.error().find(':'));
      r.fail(root[field].IsDefined() ? root[field] : root, field, ok.error().substr(field.size() + 2));
    }
    const double theta = positive_real(r, root, "rope_theta", c.model.rope_theta, false, 1e12);
    c.model = gpt_config(kind);
    c.model.rope_theta = theta;
    c.model.max_seq = c.seq;
    c.ci = bounded(r, root, "ci", 0, c.model.layers, c.ci);
    c.lr = positive_real(r, root, "lr", c.lr, false, kMaxRate);
    const std::string decay = r.text_or(root, "", "lr_schedule", "constant");
    Result<adam::LrDecay> d = adam::parse_lr_decay(decay);
    if (!d) r.fail(root["lr_schedule"], "lr_schedule", d.error());
    c.lr_schedule.decay = *d;
    c.lr_schedule.warmup_steps = bounded(r, root, "warmup_steps", 0, 100000000, 0);
    c.lr_schedule.decay_steps = bounded(r, root, "decay_steps", c.lr_schedule.warmup_steps + 1, 100000000, 0);
    c.lr_schedule.min_lr = positive_real(r, root, "min_lr", 0, true, c.lr);
    c.weight_decay = positive_real(r, root, "weight_decay", c.weight_decay, true, kMaxRate);
    c.grad_clip = positive_real(r, root, "grad_clip", 0, true, kMaxGradClip);
c.seed = std::uint64_t(r.integer_or(root, "", "seed", 0, std::numeric_limits<long>::max(), long(c.seed)));
    c.backend = r.text_or(root, "", "backend", c.backend);
    if (c.backend != "cpu" && c.backend != "cuda")
      r.fail(root["backend"], "backend", "expected cpu or cuda, got \"" + c.backend + "\"");
    const std::string compute = r.text_or(root, "", "compute", "fp32");
    Result<ComputeType> ct = parse_compute_type(compute);
    if (!ct) r.fail(root["compute"], "compute", ct.error());
    c.compute = *ct;
    const std::string precision = r.text_or(root, "", "precision", "bf16");
    Result<adam::DType> pr = adam::parse_dtype(precision);
    if (!pr) r.fail(root["precision"], "precision", "expected bf16, fp16 or fp32, got \"" + precision + "\"");
    c.precision = *pr;
    // a device smaller than 1 MiB holds no model; 1 PiB is beyond any device (and any double's exactness)
    c.capacity_bytes = std::size_t(r.bytes_or(root, "", "capacity", std::uint64_t(1) << 20, std::uint64_t(1) << 50, 0));
    c.corpus = r.text_or(root, "", "corpus", "");
    if (!c.corpus.empty() && std::filesystem::path(c.corpus).is_relative())
      c.corpus = (std::filesystem::path(source).parent_path() / c.corpus).string();
    // Read through the one file reader: a folder, a FIFO, /dev/zero or /proc/self/mem is one line
    // naming the field, never a hang or a crash.
    if (!c.corpus.empty())
      if (Result<std::string> text = read_input_file(c.corpus, "corpus", kMaxCorpusBytes); !text)
        r.fail(root["corpus"], "corpus", text.error());
    return c;
  } catch (const InputError& e) {
    return make_error(e.what());
  }
}

Result<RunConfig> load_run_config(const std::string& path) {
  Result<std::string> text = read_input_file(path, "run config");
  if (!text) return make_error(text.error());
  return parse_run_config(path, *text);
}

Result<Corpus> Corpus::load(const std::string& path) {
  if (path.empty()) {
    Corpus c;
    c.data_.assign(kShippedCorpus.begin(), kShippedCorpus.end());
    return c;
  }
  Result<std::string> text = read_input_file(path, "corpus", kMaxCorpusBytes);
  if (!text) return make_error(text.error());
  Corpus c;
  c.data_.assign(text->begin(), text->end());
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

}  // namespace memwall::exec
