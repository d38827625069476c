// Reading a Hugging Face transformers config.json into a ModelSpec (declared in model_spec.hpp).
// JSON is YAML's flow style, so YamlReader parses it and every error names file, line and field.
// Each supported model_type lists the fields it reads and the ones it knows change neither memory
// nor time (dropout, token ids, norm epsilon, rotary base); any other field is refused by name, so a
// config that means something memwall does not model never plans silently wrong.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model_spec.hpp"
#include "model/yaml_reader.hpp"

namespace memwall {
namespace {

struct Arch {
  const char* type;
  std::vector<std::string> reads;
  std::vector<std::string> ignores;  // beyond kCommonIgnored
};

// Fields of every transformers config that say nothing about memory or time.
const std::vector<std::string> kCommonIgnored = {
    "architectures", "model_type", "torch_dtype", "transformers_version", "_name_or_path", "bos_token_id",
    "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout", "hidden_dropout",
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "rope_scaling", "pretraining_tp",
    "tokenizer_class", "return_dict", "output_attentions", "output_hidden_states", "id2label", "label2id",
    "task_specific_params", "classifier_dropout", "is_decoder", "dtype"};

const std::vector<Arch>& archs() {
  static const std::vector<Arch> a = {
      {"llama",
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "max_position_embeddings", "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias",
        "head_dim"},
       {}},
      {"mistral",
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "max_position_embeddings", "tie_word_embeddings", "hidden_act", "sliding_window", "head_dim"},
       {}},
      {"mixtral",
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "max_position_embeddings", "tie_word_embeddings", "hidden_act", "sliding_window",
        "num_local_experts", "num_experts_per_tok", "head_dim"},
       {"router_aux_loss_coef", "output_router_logits", "router_jitter_noise"}},
      {"qwen2",
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "max_position_embeddings", "tie_word_embeddings", "hidden_act", "use_sliding_window",
        "sliding_window", "max_window_layers"},
       {}},
      {"gpt2",
       {"n_embd", "n_layer", "n_head", "n_inner", "n_positions", "vocab_size", "activation_function",
        "tie_word_embeddings"},
       {"n_ctx", "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_activation", "summary_first_dropout",
        "summary_proj_to_labels", "summary_type", "summary_use_proj", "scale_attn_weights",
        "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}},
      {"gpt_neox",
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
        "max_position_embeddings", "tie_word_embeddings", "hidden_act", "attention_bias", "rotary_pct",
        "use_parallel_residual"},
       {"rotary_emb_base", "rotary_emb_dim"}},
  };
  return a;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The training sequence a config implies: its context, capped at 8192 (a 128K context is a
// fine-tuning stage, not what memwall plans by default; --seq says otherwise).
constexpr long kDefaultSeqCap = 8192;

}  // namespace

std::string hf_config_fields() {
  std::string out;
  for (const Arch& a : archs()) out += std::string(a.type) + ": reads " + joined(a.reads) + "\n";
  out += "every model_type ignores " + joined(kCommonIgnored) + " (no effect on memory or time)\n";
  return out;
}

Result<ModelSpec> parse_hf_config(std::string_view json_text, const std::string& source) {
  try {
    YamlReader r(source, json_text);
    const YAML::Node& root = r.root();
    const std::string type = r.text(root, "", "model_type");
    const Arch* arch = nullptr;
    std::vector<std::string> types;
    for (const Arch& a : archs()) {
      types.push_back(a.type);
      if (type == a.type) arch = &a;
    }
    if (!arch)
      r.fail(root["model_type"], "model_type",
             "memwall reads the causal LMs " + joined(types) + "; \"" + type + "\" is not one of them (write a model YAML instead)");
    std::vector<std::string> known = arch->reads;
    known.insert(known.end(), arch->ignores.begin(), arch->ignores.end());
    known.insert(known.end(), kCommonIgnored.begin(), kCommonIgnored.end());
    r.only_keys(root, "", known);

    ModelSpec s;
    // "Meta-Llama-3-8B/config.json" is named after its folder, "llama3-8b.json" after itself
    const std::filesystem::path path(source);
    s.name = path.stem().string();
    if (s.name == "config" && !path.parent_path().filename().empty()) s.name = path.parent_path().filename().string();
    s.source = source + " (" + type + ")";
    const bool gpt2 = type == "gpt2", neox = type == "gpt_neox";
    s.hidden = r.integer(root, "", gpt2 ? "n_embd" : "hidden_size", 1, kMaxHidden);
    s.layers = int(r.integer(root, "", gpt2 ? "n_layer" : "num_hidden_layers", 1, kMaxLayers));
    s.heads = int(r.integer(root, "", gpt2 ? "n_head" : "num_attention_heads", 1, kMaxHeads));
    if (s.hidden % s.heads != 0)
      r.fail(root[gpt2 ? "n_head" : "num_attention_heads"], gpt2 ? "n_head" : "num_attention_heads",
             "expected a divisor of the hidden size " + std::to_string(s.hidden));
    s.vocab = r.integer(root, "", "vocab_size", 1, kMaxVocab);
    const long context = r.integer_or(root, "", gpt2 ? "n_positions" : "max_position_embeddings", 1, kMaxSeq, 2048);
    s.seq = std::min(context, kDefaultSeqCap);
    if (s.seq < context)
      s.note = "seq: " + std::to_string(s.seq) + " of the config's context " + std::to_string(context) +
               " (--seq sets it)";
    // an explicit head size (Mistral NeMo: 128, where 5120 / 32 = 160): q is heads x head_dim wide
    if (root["head_dim"].IsDefined() && !root["head_dim"].IsNull()) {
      s.head_size = r.integer(root, "", "head_dim", 1, kMaxHidden);
      if (s.head_size == s.hidden / s.heads) s.head_size = 0;
    }

    if (gpt2 || neox) {
      s.ffn = FfnKind::gelu;
      s.norm = NormKind::layernorm;
      const std::string act_key = gpt2 ? "activation_function" : "hidden_act";
      const std::string act = r.text_or(root, "", act_key, "gelu_new");
      if (!act.starts_with("gelu"))
        r.fail(root[act_key], act_key, "expected a GeLU (gelu, gelu_new, gelu_fast), got \"" + act + "\"");
      s.intermediate = r.integer_or(root, "", gpt2 ? "n_inner" : "intermediate_size", 1, 64 * kMaxHidden, 4 * s.hidden);
      s.positions = gpt2 ? PositionKind::learned : PositionKind::rotary;
      s.tied_embeddings = r.boolean_or(root, "", "tie_word_embeddings", gpt2);
      s.bias = r.boolean_or(root, "", "attention_bias", true) ? BiasKind::all : BiasKind::none;
      if (neox && !r.boolean_or(root, "", "attention_bias", true))
        r.fail(root["attention_bias"], "attention_bias", "GPT-NeoX without attention biases is not modelled (its MLP keeps them)");
    } else {
      s.kv_heads = int(r.integer_or(root, "", "num_key_value_heads", 1, s.heads, s.heads));
      if (s.heads % s.kv_heads != 0)
        r.fail(root["num_key_value_heads"], "num_key_value_heads", "expected a divisor of num_attention_heads " + std::to_string(s.heads));
      const std::string act = r.text_or(root, "", "hidden_act", "silu");
      if (act == "silu" || act == "swish") s.ffn = FfnKind::swiglu;
      else if (act.starts_with("gelu")) s.ffn = FfnKind::geglu;
      else r.fail(root["hidden_act"], "hidden_act", "expected silu (SwiGLU) or a gelu (GeGLU), got \"" + act + "\"");
      const long inter = r.integer(root, "", "intermediate_size", 1, 64 * kMaxHidden);
      s.norm = NormKind::rmsnorm;
      s.positions = PositionKind::rotary;
      s.tied_embeddings = r.boolean_or(root, "", "tie_word_embeddings", false);
      s.bias = type == "qwen2" ? BiasKind::qkv : BiasKind::none;
      if (type == "llama") {
        const bool attn = r.boolean_or(root, "", "attention_bias", false);
        if (r.boolean_or(root, "", "mlp_bias", false))
          r.fail(root["mlp_bias"], "mlp_bias", "biases in the MLP of a llama model are not modelled");
        if (attn) s.bias = BiasKind::attention;
      }
      if (type == "qwen2" && r.boolean_or(root, "", "use_sliding_window", false))
        r.fail(root["use_sliding_window"], "use_sliding_window",
               "a sliding window on the layers above max_window_layers only is not modelled (memwall models one window for every layer)");
      if (type == "mistral" || type == "mixtral")
        s.attention_window = r.integer_or(root, "", "sliding_window", 1, kMaxSeq, 0);
      if (type == "mixtral") {
        s.moe.experts = int(r.integer(root, "", "num_local_experts", 1, kMaxExperts));
        s.moe.experts_per_token = int(r.integer(root, "", "num_experts_per_tok", 1, s.moe.experts));
        s.moe.expert_intermediate = inter;
      } else {
        s.intermediate = inter;
      }
    }
    if (s.kv_heads == s.heads) s.kv_heads = 0;
    if (s.intermediate == 4 * s.hidden) s.intermediate = 0;
    return validate_model(std::move(s), source + ": ");
  } catch (const InputError& e) {
    std::string message = e.what();  // JSON read as YAML's flow style: call it what the user wrote
    if (const size_t at = message.find("malformed YAML"); at != std::string::npos) message.replace(at, 14, "malformed JSON");
    return make_error(message);
  } catch (const YAML::Exception& e) {
    return make_error(source + ": malformed JSON: " + e.what());
  }
}

}  // namespace memwall
