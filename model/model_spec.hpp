// ModelSpec: the shape of a decoder-only transformer: the paper's GPT (layers, hidden, heads,
// sequence, vocabulary: every other field at its default) and the kinds trained today (grouped-query
// attention, gated feed-forward, RMSNorm, rotary positions, untied embeddings, mixture of experts),
// read from a model YAML or a Hugging Face config.json; and the built-in catalogue: every
// configuration the ZeRO-Infinity paper names, and today's published models with their sources. The paper's
// tables disagree (Table 1's 10T has 200 layers, Fig. 2a's 195), so each entry's name says which
// table it comes from: "fig2a-10T", "table1-10T". K in hidden sizes is 1024, as in the paper.
// Value types; the catalogue is immutable and safe to read from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/result.hpp"

namespace YAML {
class Node;
}

namespace memwall {

class YamlReader;

// What a model may be: far beyond the paper's largest (315 layers, 160K hidden, 1024 heads), small
// enough that counts stay exact in an int and products of them in a double.
inline constexpr int kMaxLayers = 100000;
inline constexpr int kMaxHeads = 65536;
inline constexpr long kMaxSeq = 1L << 24;
inline constexpr long kMaxVocab = 1L << 24;

// The feed-forward: gelu is the paper's (fc1 C -> I, GeLU, fc2 I -> C); swiglu and geglu are gated
// (fc1 makes the gate and the up projection, C -> 2I, the activation multiplies them, fc2 I -> C).
enum class FfnKind { gelu, swiglu, geglu };
enum class NormKind { layernorm, rmsnorm };      // LayerNorm: scale and shift (2C); RMSNorm: scale (C)
enum class PositionKind { learned, rotary };     // learned: a (seq, C) table; rotary: no parameters
// Which linear layers have biases: all (GPT-2, GPT-NeoX), none (Llama, Mistral), qkv (Qwen2),
// attention (qkv and the attention projection).
enum class BiasKind { all, none, qkv, attention };
const char* to_string(FfnKind k);
const char* to_string(NormKind k);
const char* to_string(PositionKind k);
const char* to_string(BiasKind k);

// Mixture of experts (Mixtral, Switch): each block's feed-forward is `experts` copies of it with
// `expert_intermediate` each, a router (C -> experts) picks `experts_per_token` for every token;
// `shared_experts` more run on every token. experts == 0: a dense model.
struct MoeSpec {
  int experts = 0;
  int experts_per_token = 0;
  long expert_intermediate = 0;
  int shared_experts = 0;
};

inline constexpr int kMaxExperts = 4096;

struct ModelSpec {
  std::string name;    // "fig2a-10T", a file stem, or "custom"
  std::string source;  // "paper Fig. 2a", a file path, or "flags"
  int layers = 0;      // nl
  long hidden = 0;     // hd
  int heads = 0;       // attention (query) heads
  long seq = 1024;     // sequence length the paper uses throughout (Sec. 4.2)
  long vocab = 50257;  // GPT-2 byte-pair vocabulary; the paper's equations ignore the embedding
  std::string note;    // caveats, e.g. "heads not given in Table 1: hidden/128"
  // Today's kinds; the defaults are the paper's GPT.
  int kv_heads = 0;          // key/value heads: 0 or heads is MHA, 1 MQA, between GQA; divides heads
  long head_size = 0;        // channels per attention head; 0: hidden / heads (Mistral NeMo: 128 of 5120 / 32)
  FfnKind ffn = FfnKind::gelu;
  long intermediate = 0;     // feed-forward inner size I; 0: 4·hidden
  NormKind norm = NormKind::layernorm;
  PositionKind positions = PositionKind::learned;
  bool tied_embeddings = true;  // the LM head uses the token embedding's weights (Sec. 7.1.1)
  BiasKind bias = BiasKind::all;
  long attention_window = 0;    // sliding-window attention: keys per query; 0: the whole sequence
  MoeSpec moe;

  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  long head_dim() const { return head_size > 0 ? head_size : heads > 0 ? hidden / heads : 0; }
  long attention_width() const { return long(heads) * head_dim(); }  // q's and the context's channels
  long ffn_size() const { return intermediate > 0 ? intermediate : 4 * hidden; }
  bool gated() const { return ffn != FfnKind::gelu; }
  bool is_moe() const { return moe.experts > 0; }
  // Every field beyond the paper's five at its default: the model Eq. 1-11 describe exactly.
  bool paper_gpt() const;
  // "GQA 8 KV heads, SwiGLU 14336, RMSNorm, rotary, untied" or "" for the paper's GPT.
  std::string kind_words() const;
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
  double published_params = 0;         // what the model's authors state (0: a paper configuration)
  double published_active_params = 0;  // per token, for a mixture of experts
};

const std::vector<CatalogueEntry>& model_catalogue();

// The catalogue entry named `name`, or an error listing close names.
Result<CatalogueEntry> find_catalogue_entry(std::string_view name);

// A catalogue name, a path to a model YAML file (model_yaml_fields), or a path ending in .json: a
// Hugging Face config.json (parse_hf_config).
Result<ModelSpec> load_model(const std::string& name_or_path);
Result<ModelSpec> parse_model_spec(std::string_view yaml_text, const std::string& source);

// The fields of a model YAML, in the order they are written; also the `model:` section of a plan.
const std::vector<std::string>& model_yaml_fields();
// Reads those fields of `map` (at dotted `path`, "" at the top) into `m`, refusing other keys;
// throws YamlReader's InputError naming file, line and field.
void read_model_fields(const YamlReader& r, const YAML::Node& map, const std::string& path, ModelSpec& m);
// The kind's fields among them (kv_heads, ffn, ..., moe: those after the paper's five and note),
// and their reader, which reads them into `m` (its heads already set) and leaves other keys alone:
// for a file that holds them beside its own settings (the executor's run config).
const std::vector<std::string>& model_kind_fields();
void read_model_kind(const YamlReader& r, const YAML::Node& map, const std::string& path, ModelSpec& m);
// Writes them as YAML lines, each prefixed by `indent`; fields at their default are left out, so
// the paper's models write the five they always had.
std::string model_yaml(const ModelSpec& m, const std::string& indent);

// A Hugging Face transformers config.json of a causal LM: model_type llama, mistral, mixtral,
// qwen2, gpt2 or gpt_neox (hf_config_fields says what each reads). A field that would change
// memory or time in a way memwall does not model, or that it does not know, is refused by name.
Result<ModelSpec> parse_hf_config(std::string_view json_text, const std::string& source);
// "llama: reads hidden_size, ...; ignores rms_norm_eps, ..." per supported model_type (for --help
// and docs).
std::string hf_config_fields();

// Checks a spec's fields against each other (kv_heads divides heads, the MoE fields together, ...);
// `where` prefixes the field ("--" for flags, "" for a catalogue entry).
Result<ModelSpec> validate_model(ModelSpec s, const std::string& where);

// A model from --layers/--hidden/--heads; checks the ranges above and hidden % heads == 0; the
// messages name the flag ("--heads: ...").
Result<ModelSpec> model_from_shape(int layers, long hidden, int heads, long seq = 1024, long vocab = 50257);

// Fig. 2a's five rows in the paper's order (0.1T ... 100T).
std::vector<ModelSpec> fig2a_models();

}  // namespace memwall
