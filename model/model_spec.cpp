#include "model/model_spec.hpp"

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
  return s;
}

}  // namespace

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
    r.only_keys(root, "", {"name", "layers", "hidden", "heads", "seq", "vocab", "note"});
    ModelSpec s;
    s.name = r.text_or(root, "", "name", std::filesystem::path(source).stem().string());
    s.source = source;
    s.layers = int(r.integer(root, "", "layers", 1, kMaxLayers));
    s.hidden = r.hidden(root, "", "hidden");
    s.heads = int(r.integer(root, "", "heads", 1, kMaxHeads));
    s.seq = r.integer_or(root, "", "seq", 1, kMaxSeq, s.seq);
    s.vocab = r.integer_or(root, "", "vocab", 1, kMaxVocab, s.vocab);
    s.note = r.text_or(root, "", "note", "");
    if (s.hidden % s.heads != 0) r.fail(root["heads"], "heads", "expected a divisor of hidden " + std::to_string(s.hidden));
    return s;
  } catch (const InputError& e) {
    return make_error(e.what());
  } catch (const YAML::Exception& e) {
    return make_error(source + ": " + e.what());
  }
}

Result<ModelSpec> load_model(const std::string& name_or_path) {
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
