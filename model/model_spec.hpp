// ModelSpec: the shape of a GPT-style transformer (layers, hidden, heads, sequence, vocabulary),
// and the built-in catalogue of every configuration the ZeRO-Infinity paper names. The paper's
// tables disagree (Table 1's 10T has 200 layers, Fig. 2a's 195), so each entry's name says which
// table it comes from: "fig2a-10T", "table1-10T". K in hidden sizes is 1024, as in the paper.
// Value types; the catalogue is immutable and safe to read from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/result.hpp"

namespace memwall {

// What a model may be: far beyond the paper's largest (315 layers, 160K hidden, 1024 heads), small
// enough that counts stay exact in an int and products of them in a double.
inline constexpr int kMaxLayers = 100000;
inline constexpr int kMaxHeads = 65536;
inline constexpr long kMaxSeq = 1L << 24;
inline constexpr long kMaxVocab = 1L << 24;

struct ModelSpec {
  std::string name;    // "fig2a-10T", a file stem, or "custom"
  std::string source;  // "paper Fig. 2a", a file path, or "flags"
  int layers = 0;      // nl
  long hidden = 0;     // hd
  int heads = 0;       // attention heads
  long seq = 1024;     // sequence length the paper uses throughout (Sec. 4.2)
  long vocab = 50257;  // GPT-2 byte-pair vocabulary; the paper's equations ignore the embedding
  std::string note;    // caveats, e.g. "heads not given in Table 1: hidden/128"
};

// How the paper ran a catalogue model (Table 1 and Tables 4-8): total GPUs, micro-batch per GPU
// (fractional in Table 1's 20T row), tensor-slicing degree and where parameters / optimizer live.
struct PaperSetup {
  int gpus = 0;
  double bsz = 0;
  int mp = 1;
  std::string param_tier;  // "gpu", "cpu", "nvme"
  std::string optim_tier;
  std::string figure;      // "Fig. 5a"
};

struct CatalogueEntry {
  ModelSpec spec;
  std::vector<PaperSetup> setups;  // empty for Fig. 2a rows (a memory table, not a run)
};

const std::vector<CatalogueEntry>& model_catalogue();

// The catalogue entry named `name`, or an error listing close names.
Result<CatalogueEntry> find_catalogue_entry(std::string_view name);

// A catalogue name, or a path to a model YAML file (fields: name, layers, hidden, heads, seq, vocab).
Result<ModelSpec> load_model(const std::string& name_or_path);
Result<ModelSpec> parse_model_spec(std::string_view yaml_text, const std::string& source);

// A model from --layers/--hidden/--heads; checks the ranges above and hidden % heads == 0; the
// messages name the flag ("--heads: ...").
Result<ModelSpec> model_from_shape(int layers, long hidden, int heads, long seq = 1024, long vocab = 50257);

// Fig. 2a's five rows in the paper's order (0.1T ... 100T).
std::vector<ModelSpec> fig2a_models();

}  // namespace memwall
