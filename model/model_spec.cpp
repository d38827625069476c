#include "model/model_spec.hpp"

#include <array>
#include <filesystem>
#include <optional>

#include "model/suggest.hpp"
#include "model/yaml_reader.hpp"

namespace memwall {
namespace {

constexpr long K = 1024;

CatalogueEntry entry(std::string name, std::string source, int layers, long hidden, int heads,
                     std::vector<PaperSetup> setups = {}, std::string note = "") {
  ModelSpec s;
  s.name = std::move(name);
  s.source = std::move(source);
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.note = std::move(note);
  return CatalogueEntry{s, std::move(setups)};
}

// A model published after the paper, as its released config gives it; `published` is the parameter
// count its authors state (and `active` per token for a mixture of experts).
struct Modern {
  std::string name, source;
  int layers;
  long hidden;
  int heads, kv_heads;
  FfnKind ffn;
  long intermediate, vocab, seq;
  bool tied;
  BiasKind bias;
  NormKind norm;
  PositionKind positions;
  double published, active = 0;
  std::string note = "";
  MoeSpec moe = {};
  long window = 0;
};

CatalogueEntry modern(const Modern& d) {
  CatalogueEntry e = entry(d.name, d.source, d.layers, d.hidden, d.heads, {}, d.note);
  ModelSpec& s = e.spec;
  s.kv_heads = d.kv_heads == d.heads ? 0 : d.kv_heads;
  s.ffn = d.ffn;
  s.intermediate = d.intermediate == 4 * d.hidden ? 0 : d.intermediate;
  s.vocab = d.vocab;
  s.seq = d.seq;
  s.tied_embeddings = d.tied;
  s.bias = d.bias;
  s.norm = d.norm;
  s.positions = d.positions;
  s.moe = d.moe;
  s.attention_window = d.window;
  e.published_params = d.published;
  e.published_active_params = d.active;
  return e;
}

std::vector<CatalogueEntry> build_catalogue() {
  const std::string t1_heads = "heads not given in Table 1: hidden/128 assumed";
  std::vector<CatalogueEntry> c = {
      // Fig. 2a: memory requirements for massive models (bsz 32, seq 1024, ci 1).
      entry("fig2a-0.1T", "paper Fig. 2a", 80, 10 * K, 128),
      entry("fig2a-0.5T", "paper Fig. 2a", 100, 20 * K, 160),
      entry("fig2a-1T", "paper Fig. 2a", 128, 25 * K, 256),
      entry("fig2a-10T", "paper Fig. 2a", 195, 64 * K, 512),
      entry("fig2a-100T", "paper Fig. 2a", 315, 160 * K, 1024),
      // Table 1: experiment configurations of Fig. 5 (1 node = 16 GPUs, 32 nodes = 512 GPUs).
      entry("table1-10B", "paper Table 1", 50, 4 * K, 32, {{16, 8, 1, "gpu", "gpu", "Fig. 5c"}}, t1_heads),
      entry("table1-50B", "paper Table 1", 62, 8 * K, 64, {{16, 26, 1, "cpu", "nvme", "Fig. 5c"}}, t1_heads),
      entry("table1-100B", "paper Table 1", 125, 8 * K, 64, {{16, 24, 1, "cpu", "nvme", "Fig. 5c"}}, t1_heads),
      entry("table1-0.5T", "paper Table 1", 124, 18 * K, 144,
            {{16, 8, 1, "nvme", "nvme", "Fig. 5c"}, {512, 7, 4, "gpu", "gpu", "Fig. 5a"}}, t1_heads),
      entry("table1-1T", "paper Table 1", 128, 25 * K, 256,
            {{16, 7, 1, "nvme", "nvme", "Fig. 5c"}, {512, 5, 4, "gpu", "gpu", "Fig. 5a"}},
            "heads not given in Table 1: 256 from Table 4's 1000B row (same shape)"),
      entry("table1-5T", "paper Table 1", 174, 48 * K, 384, {{512, 3, 4, "nvme", "nvme", "Fig. 5a"}}, t1_heads),
      entry("table1-10T", "paper Table 1", 200, 64 * K, 512, {{512, 2, 4, "nvme", "nvme", "Fig. 5a"}}, t1_heads),
      entry("table1-20T", "paper Table 1", 205, 88 * K, 704, {{512, 1.25, 8, "nvme", "nvme", "Fig. 5a"}}, t1_heads),
      // Table 4: Fig. 11(a) / Fig. 6, maximum model size on one DGX-2 (16 GPUs, total batch 16).
      entry("table4-1.4B", "paper Table 4", 40, 1536, 16, {{16, 1, 1, "gpu", "gpu", "Fig. 6"}}),
      entry("table4-10B", "paper Table 4", 50, 4096, 16, {{16, 1, 1, "gpu", "gpu", "Fig. 6"}}),
      entry("table4-13B", "paper Table 4", 64, 4096, 16, {{16, 1, 1, "gpu", "cpu", "Fig. 6"}}),
      entry("table4-20B", "paper Table 4", 98, 4096, 32,
            {{16, 1, 1, "gpu", "gpu", "Fig. 6"}, {16, 1, 4, "gpu", "gpu", "Fig. 6"}}),
      entry("table4-70B", "paper Table 4", 125, 8192, 32, {{16, 1, 1, "cpu", "cpu", "Fig. 6"}}),
      entry("table4-1000B", "paper Table 4", 128, 25600, 256, {{16, 5, 4, "nvme", "nvme", "Fig. 6"}}),
      // Table 5: Fig. 11(b) / Fig. 7, one-layer models of growing hidden size on 16 GPUs.
      entry("table5-h8K", "paper Table 5", 1, 8192, 16, {{16, 1, 1, "gpu", "gpu", "Fig. 7"}}),
      entry("table5-h16K", "paper Table 5", 1, 16384, 16, {{16, 1, 1, "gpu", "gpu", "Fig. 7"}}),
      entry("table5-h32K", "paper Table 5", 1, 32768, 16, {{16, 1, 1, "gpu", "gpu", "Fig. 7"}}),
      entry("table5-h64K", "paper Table 5", 1, 65536, 32, {{16, 1, 1, "gpu", "gpu", "Fig. 7"}}),
      // Table 6: Fig. 11(c) / Fig. 8, 8B model on 4-64 GPUs, batch 2 per GPU.
      entry("table6-8B", "paper Table 6", 10, 8192, 16,
            {{4, 2, 1, "gpu", "cpu", "Fig. 8"}, {16, 2, 1, "gpu", "cpu", "Fig. 8"},
             {32, 2, 1, "gpu", "cpu", "Fig. 8"}, {64, 2, 1, "gpu", "cpu", "Fig. 8"}}),
      // Table 7: Fig. 11(d) / Fig. 9, the same 8B model on 64 GPUs, batch 2-16 per GPU.
      entry("table7-8B", "paper Table 7", 10, 8192, 16,
            {{64, 2, 1, "gpu", "cpu", "Fig. 9"}, {64, 4, 1, "gpu", "cpu", "Fig. 9"},
             {64, 8, 1, "gpu", "cpu", "Fig. 9"}, {64, 10, 1, "gpu", "cpu", "Fig. 9"},
             {64, 14, 1, "gpu", "cpu", "Fig. 9"}, {64, 16, 1, "gpu", "cpu", "Fig. 9"}}),
      // Table 8: Fig. 11(e) / Fig. 10, activation checkpoint offload, 5 layers, batch 4 per GPU.
      entry("table8-h2K", "paper Table 8", 5, 2048, 16, {{32, 4, 1, "gpu", "cpu", "Fig. 10"}}),
      entry("table8-h8K", "paper Table 8", 5, 8192, 16, {{32, 4, 1, "gpu", "cpu", "Fig. 10"}}),
      entry("table8-h16K", "paper Table 8", 5, 16384, 16, {{32, 4, 1, "gpu", "cpu", "Fig. 10"}}),
      entry("table8-h32K", "paper Table 8", 5, 32768, 16, {{32, 4, 1, "gpu", "cpu", "Fig. 10"}}),
      entry("table8-h64K", "paper Table 8", 5, 65536, 16, {{64, 4, 1, "gpu", "nvme", "Fig. 10"}}),
  };
  // Models people train today, from their released config.json (huggingface.co/<repo>) or paper.
  // seq is the context they were pre-trained at (what memwall trains with unless --seq says).
  const auto swiglu = FfnKind::swiglu, gelu = FfnKind::gelu;
  const auto none = BiasKind::none, all = BiasKind::all;
  const auto rms = NormKind::rmsnorm, ln = NormKind::layernorm;
  const auto rope = PositionKind::rotary, learned = PositionKind::learned;
  const std::vector<Modern> today = {
      {"gpt2-124M", "openai-community/gpt2 config.json (Radford et al. 2019)", 12, 768, 12, 12, gelu, 3072, 50257,
       1024, true, all, ln, learned, 124e6},
      {"gpt3-175B", "Brown et al. 2020, Table 2.1 (GPT-3 175B)", 96, 12288, 96, 96, gelu, 49152, 50257, 2048, true, all,
       ln, learned, 175e9, 0, "GPT-3's alternating locally banded sparse layers are counted dense"},
      {"llama3-8B", "meta-llama/Meta-Llama-3-8B config.json", 32, 4096, 32, 8, swiglu, 14336, 128256, 8192, false, none,
       rms, rope, 8.03e9},
      {"llama3-70B", "meta-llama/Meta-Llama-3-70B config.json", 80, 8192, 64, 8, swiglu, 28672, 128256, 8192, false,
       none, rms, rope, 70.6e9},
      {"llama3.1-405B", "meta-llama/Llama-3.1-405B config.json (Llama 3 paper, Table 3)", 126, 16384, 128, 8, swiglu,
       53248, 128256, 8192, false, none, rms, rope, 405e9, 0,
       "seq: the pre-training context 8192 (the config allows 131072)"},
      {"mistral-7B", "mistralai/Mistral-7B-v0.1 config.json (Jiang et al. 2023)", 32, 4096, 32, 8, swiglu, 14336, 32000,
       8192, false, none, rms, rope, 7.24e9, 0, "sliding-window attention of 4096 keys", {}, 4096},
      {"mixtral-8x7B", "mistralai/Mixtral-8x7B-v0.1 config.json (Jiang et al. 2024)", 32, 4096, 32, 8, swiglu, 14336,
       32000, 4096, false, none, rms, rope, 46.7e9, 12.9e9,
       "seq: 4096 assumed for training (the config allows 32768)", {8, 2, 14336, 0}},
      {"qwen2-72B", "Qwen/Qwen2-72B config.json (Qwen2 technical report)", 80, 8192, 64, 8, swiglu, 29568, 152064, 4096,
       false, BiasKind::qkv, rms, rope, 72.7e9, 0, "seq: 4096 assumed for training (the config allows 32768)"},
  };
  for (const Modern& m : today) c.push_back(modern(m));
  return c;
}

Result<ModelSpec> validate(ModelSpec s, const std::string& where) {
  auto range = [&](const char* field, long v, long lo, long hi) -> std::optional<Error> {
    if (v >= lo && v <= hi) return std::nullopt;
    return make_error(where + field + ": expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                      ", got " + std::to_string(v));
  };
  if (auto e = range("layers", s.layers, 1, kMaxLayers)) return *e;
  if (auto e = range("hidden", s.hidden, 1, kMaxHidden)) return *e;
  if (auto e = range("heads", s.heads, 1, kMaxHeads)) return *e;
  if (s.hidden % s.heads != 0)
    return make_error(where + "heads: expected a divisor of hidden " + std::to_string(s.hidden) + ", got " +
                      std::to_string(s.heads));
  if (auto e = range("seq", s.seq, 1, kMaxSeq)) return *e;
  if (auto e = range("vocab", s.vocab, 1, kMaxVocab)) return *e;
  if (auto e = range("kv_heads", s.kv_heads, 0, s.heads)) return *e;
  if (s.kv_heads > 0 && s.heads % s.kv_heads != 0)
    return make_error(where + "kv_heads: expected a divisor of heads " + std::to_string(s.heads) + ", got " +
                      std::to_string(s.kv_heads));
  if (auto e = range("head_dim", s.head_size, 0, kMaxHidden)) return *e;
  if (auto e = range("intermediate", s.intermediate, 0, 64 * kMaxHidden)) return *e;
  if (auto e = range("attention_window", s.attention_window, 0, kMaxSeq)) return *e;
  if (auto e = range("moe.experts", s.moe.experts, 0, kMaxExperts)) return *e;
  if (s.moe.experts > 0) {
    if (auto e = range("moe.experts_per_token", s.moe.experts_per_token, 1, s.moe.experts)) return *e;
    if (auto e = range("moe.expert_intermediate", s.moe.expert_intermediate, 1, 64 * kMaxHidden)) return *e;
    if (auto e = range("moe.shared_experts", s.moe.shared_experts, 0, kMaxExperts)) return *e;
  } else if (s.moe.experts_per_token || s.moe.expert_intermediate || s.moe.shared_experts) {
    return make_error(where + "moe.experts: expected the number of experts (at least 1) beside the other moe fields");
  }
  return s;
}

template <typename E, size_t N>
E parse_enum(const YamlReader& r, const YAML::Node& map, const std::string& path, const std::string& key,
             const std::array<E, N>& values, E fallback) {
  const std::string text = r.text_or(map, path, key, to_string(fallback));
  std::string list;
  for (E v : values) {
    if (text == to_string(v)) return v;
    list += (list.empty() ? "" : ", ") + std::string(to_string(v));
  }
  r.fail(map[key], YamlReader::join(path, key), "expected one of " + list + ", got \"" + text + "\"");
}

}  // namespace

const char* to_string(FfnKind k) {
  switch (k) {
    case FfnKind::gelu: return "gelu";
    case FfnKind::swiglu: return "swiglu";
    case FfnKind::geglu: return "geglu";
  }
  return "?";
}
const char* to_string(NormKind k) { return k == NormKind::rmsnorm ? "rmsnorm" : "layernorm"; }
const char* to_string(PositionKind k) { return k == PositionKind::rotary ? "rotary" : "learned"; }
const char* to_string(BiasKind k) {
  switch (k) {
    case BiasKind::all: return "all";
    case BiasKind::none: return "none";
    case BiasKind::qkv: return "qkv";
    case BiasKind::attention: return "attention";
  }
  return "?";
}

bool ModelSpec::paper_gpt() const {
  return kv() == heads && attention_width() == hidden && ffn == FfnKind::gelu && ffn_size() == 4 * hidden && norm == NormKind::layernorm &&
         positions == PositionKind::learned && tied_embeddings && bias == BiasKind::all && attention_window == 0 &&
         !is_moe();
}

std::string ModelSpec::kind_words() const {
  std::vector<std::string> w;
  if (kv() == 1) w.push_back("MQA");
  else if (kv() != heads) w.push_back("GQA " + std::to_string(kv()) + " KV heads");
  if (attention_width() != hidden) w.push_back("head size " + std::to_string(head_dim()));
  if (attention_window > 0) w.push_back("window " + std::to_string(attention_window));
  if (is_moe())
    w.push_back("MoE " + std::to_string(moe.experts) + " experts, top " + std::to_string(moe.experts_per_token) +
                (moe.shared_experts ? " + " + std::to_string(moe.shared_experts) + " shared" : "") + ", " +
                std::string(ffn == FfnKind::gelu ? "GeLU" : ffn == FfnKind::swiglu ? "SwiGLU" : "GeGLU") + " " +
                std::to_string(moe.expert_intermediate));
  else if (ffn != FfnKind::gelu || ffn_size() != 4 * hidden)
    w.push_back(std::string(ffn == FfnKind::gelu ? "GeLU" : ffn == FfnKind::swiglu ? "SwiGLU" : "GeGLU") + " " +
                std::to_string(ffn_size()));
  if (norm == NormKind::rmsnorm) w.push_back("RMSNorm");
  if (positions == PositionKind::rotary) w.push_back("rotary");
  if (!tied_embeddings) w.push_back("untied");
  if (bias != BiasKind::all) w.push_back(std::string("bias ") + to_string(bias));
  std::string out;
  for (const std::string& s : w) out += (out.empty() ? "" : ", ") + s;
  return out;
}

Result<ModelSpec> validate_model(ModelSpec s, const std::string& where) { return validate(std::move(s), where); }

const std::vector<std::string>& model_yaml_fields() {
  static const std::vector<std::string> f = {"name", "layers", "hidden", "heads", "seq", "vocab", "note", "kv_heads",
                                             "head_dim", "ffn", "intermediate", "norm", "positions",
                                             "tied_embeddings", "bias", "attention_window", "moe"};
  return f;
}

void read_model_fields(const YamlReader& r, const YAML::Node& map, const std::string& path, ModelSpec& s) {
  r.only_keys(map, path, model_yaml_fields());
  const auto at = [&](const char* key) { return YamlReader::join(path, key); };
  s.layers = int(r.integer(map, path, "layers", 1, kMaxLayers));
  s.hidden = r.hidden(map, path, "hidden");
  s.heads = int(r.integer(map, path, "heads", 1, kMaxHeads));
  s.seq = r.integer_or(map, path, "seq", 1, kMaxSeq, s.seq);
  s.vocab = r.integer_or(map, path, "vocab", 1, kMaxVocab, s.vocab);
  s.note = r.text_or(map, path, "note", s.note);
  if (s.hidden % s.heads != 0) r.fail(map["heads"], at("heads"), "expected a divisor of hidden " + std::to_string(s.hidden));
  read_model_kind(r, map, path, s);
}

const std::vector<std::string>& model_kind_fields() {
  static const std::vector<std::string> f(model_yaml_fields().begin() + 7, model_yaml_fields().end());
  return f;
}

void read_model_kind(const YamlReader& r, const YAML::Node& map, const std::string& path, ModelSpec& s) {
  const auto at = [&](const char* key) { return YamlReader::join(path, key); };
  s.kv_heads = int(r.integer_or(map, path, "kv_heads", 1, s.heads, s.kv_heads));
  if (s.kv_heads > 0 && s.heads % s.kv_heads != 0)
    r.fail(map["kv_heads"], at("kv_heads"), "expected a divisor of heads " + std::to_string(s.heads));
  s.head_size = r.integer_or(map, path, "head_dim", 1, kMaxHidden, s.head_size);
  if (s.head_size == s.hidden / s.heads) s.head_size = 0;  // the default, written as such
  s.ffn = parse_enum(r, map, path, "ffn", std::array{FfnKind::gelu, FfnKind::swiglu, FfnKind::geglu}, s.ffn);
  s.intermediate = r.integer_or(map, path, "intermediate", 1, 64 * kMaxHidden, s.intermediate);
  s.norm = parse_enum(r, map, path, "norm", std::array{NormKind::layernorm, NormKind::rmsnorm}, s.norm);
  s.positions = parse_enum(r, map, path, "positions", std::array{PositionKind::learned, PositionKind::rotary}, s.positions);
  s.tied_embeddings = r.boolean_or(map, path, "tied_embeddings", s.tied_embeddings);
  s.bias = parse_enum(r, map, path, "bias",
                      std::array{BiasKind::all, BiasKind::none, BiasKind::qkv, BiasKind::attention}, s.bias);
  s.attention_window = r.integer_or(map, path, "attention_window", 1, kMaxSeq, s.attention_window);
  if (YAML::Node moe = map["moe"]; moe.IsDefined() && !moe.IsNull()) {
    const std::string mp = at("moe");
    if (!moe.IsMap()) r.fail(moe, mp, "expected a mapping: {experts, experts_per_token, expert_intermediate, shared_experts}");
    r.only_keys(moe, mp, {"experts", "experts_per_token", "expert_intermediate", "shared_experts"});
    s.moe.experts = int(r.integer(moe, mp, "experts", 1, kMaxExperts));
    s.moe.experts_per_token = int(r.integer(moe, mp, "experts_per_token", 1, s.moe.experts));
    s.moe.expert_intermediate = r.integer(moe, mp, "expert_intermediate", 1, 64 * kMaxHidden);
    s.moe.shared_experts = int(r.integer_or(moe, mp, "shared_experts", 0, kMaxExperts, 0));
  }
}

std::string model_yaml(const ModelSpec& m, const std::string& in) {
  std::string o;
  auto line = [&](const std::string& k, const std::string& v) { o += in + k + ": " + v + "\n"; };
  line("name", yaml_scalar(m.name));
  line("layers", std::to_string(m.layers));
  line("hidden", std::to_string(m.hidden));
  line("heads", std::to_string(m.heads));
  line("seq", std::to_string(m.seq));
  line("vocab", std::to_string(m.vocab));
  if (m.kv_heads > 0 && m.kv_heads != m.heads) line("kv_heads", std::to_string(m.kv_heads));
  if (m.attention_width() != m.hidden) line("head_dim", std::to_string(m.head_dim()));
  if (m.ffn != FfnKind::gelu) line("ffn", to_string(m.ffn));
  if (m.intermediate > 0 && m.intermediate != 4 * m.hidden) line("intermediate", std::to_string(m.intermediate));
  if (m.norm != NormKind::layernorm) line("norm", to_string(m.norm));
  if (m.positions != PositionKind::learned) line("positions", to_string(m.positions));
  if (!m.tied_embeddings) line("tied_embeddings", "false");
  if (m.bias != BiasKind::all) line("bias", to_string(m.bias));
  if (m.attention_window > 0) line("attention_window", std::to_string(m.attention_window));
  if (m.is_moe())
    line("moe", "{experts: " + std::to_string(m.moe.experts) + ", experts_per_token: " +
                    std::to_string(m.moe.experts_per_token) + ", expert_intermediate: " +
                    std::to_string(m.moe.expert_intermediate) + ", shared_experts: " +
                    std::to_string(m.moe.shared_experts) + "}");
  return o;
}

const std::vector<CatalogueEntry>& model_catalogue() {
  static const std::vector<CatalogueEntry> catalogue = build_catalogue();
  return catalogue;
}

Result<CatalogueEntry> find_catalogue_entry(std::string_view name) {
  for (const auto& e : model_catalogue())
    if (e.spec.name == name) return e;
  for (const auto& e : model_catalogue())  // names are case-insensitive: TABLE1-10b is table1-10B
    if (lower_ascii(e.spec.name) == lower_ascii(name)) return e;
  std::vector<std::string> names;
  for (const auto& e : model_catalogue()) names.push_back(e.spec.name);
  const std::string near = did_you_mean(name, names);
  return make_error("--model: unknown model \"" + std::string(name) + "\"" +
                    (near.empty() ? " (not one of the catalogue's " + std::to_string(names.size()) +
                                        " models, which `memwall models` lists; or give a model .yaml file)"
                                  : near));
}

Result<ModelSpec> parse_model_spec(std::string_view yaml_text, const std::string& source) {
  try {
    YamlReader r(source, yaml_text);
    const YAML::Node& root = r.root();
    ModelSpec s;
    s.name = r.text_or(root, "", "name", std::filesystem::path(source).stem().string());
    s.source = source;
    read_model_fields(r, root, "", s);
    return validate(std::move(s), source + ": ");
  } catch (const InputError& e) {
    return make_error(e.what());
  } catch (const YAML::Exception& e) {
    return make_error(source + ": " + e.what());
  }
}

Result<ModelSpec> load_model(const std::string& name_or_path) {
  if (name_or_path.ends_with(".json")) {
    Result<std::string> text = read_input_file(name_or_path, "model config");
    if (!text) return make_error(text.error());
    return parse_hf_config(*text, name_or_path);
  }
  bool looks_like_file = name_or_path.ends_with(".yaml") || name_or_path.ends_with(".yml");
  if (!looks_like_file) {
    Result<CatalogueEntry> e = find_catalogue_entry(name_or_path);
    if (!e) return make_error(e.error());
    return e->spec;
  }
  Result<std::string> text = read_input_file(name_or_path, "model");
  if (!text) return make_error(text.error());
  return parse_model_spec(*text, name_or_path);
}

Result<ModelSpec> model_from_shape(int layers, long hidden, int heads, long seq, long vocab) {
  ModelSpec s;
  s.name = "custom";
  s.source = "flags";
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.seq = seq;
  s.vocab = vocab;
  return validate(s, "--");
}

std::vector<ModelSpec> fig2a_models() {
  std::vector<ModelSpec> out;
  for (const auto& e : model_catalogue())
    if (e.spec.name.starts_with("fig2a-")) out.push_back(e.spec);
  return out;
}

}  // namespace memwall
