// `memwall models` and `memwall profiles`: what is built in, so users can pick a name.
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "model/analysis.hpp"
#include "model/units.hpp"

namespace memwall::cli {

Command add_models(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("models", "List the built-in model catalogue: every model the paper names and today's published ones\n(params: every parameter, embeddings included; Eq. 1: 12 x layers x hidden^2, the paper's count)");
  sub->add_flag("--json", *json, "JSON output");
  return {sub, [json]() {
            nlohmann::ordered_json rows = nlohmann::ordered_json::array();
            std::vector<std::vector<std::string>> t = {
                {"name", "params", "Eq. 1", "published", "layers", "hidden", "heads", "seq", "kind", "source"}};
            for (const auto& e : model_catalogue()) {
              const ModelSpec& m = e.spec;
              const double params = model_param_count(m), active = active_param_count(m);
              std::string count = format_count(params), published = "";
              if (m.is_moe()) count += " (" + format_count(active) + " active)";
              if (e.published_params > 0) {
                published = format_count(e.published_params);
                if (e.published_active_params > 0) published += " (" + format_count(e.published_active_params) + ")";
              }
              const std::string kind = m.paper_gpt() ? "GPT" : m.kind_words();
              const std::string eq1 = m.paper_gpt() ? format_count(params_eq1(m.layers, m.hidden)) : "";
              t.push_back({m.name, count, eq1, published, std::to_string(m.layers), std::to_string(m.hidden),
                           std::to_string(m.heads), std::to_string(m.seq), kind, m.source});
              nlohmann::ordered_json row = {{"name", m.name},     {"params", params},   {"active_params", active},
                                            {"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads},
                                            {"kv_heads", m.kv()}, {"seq", m.seq},       {"vocab", m.vocab},
                                            {"kind", kind},       {"source", m.source}, {"note", m.note}};
              if (m.paper_gpt()) row["params_eq1"] = params_eq1(m.layers, m.hidden);
              if (e.published_params > 0) row["published_params"] = e.published_params;
              if (e.published_active_params > 0) row["published_active_params"] = e.published_active_params;
              rows.push_back(std::move(row));
            }
            write_output("", *json ? rows.dump(2) + "\n" : render_table(t, 0));
            return 0;
          }};
}

Command add_profiles(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("profiles", "List the built-in hardware profiles");
  sub->add_flag("--json", *json, "JSON output");
  return {sub, [json]() {
            nlohmann::ordered_json rows = nlohmann::ordered_json::array();
            std::vector<std::vector<std::string>> t = {
                {"name", "GPUs", "GPU memory", "peak", "GPU-GPU", "CPU per GPU", "NVMe per GPU", "description"}};
            for (const auto& name : builtin_profile_names()) {
              HardwareProfile p = take(load_profile(name));
              t.push_back({name, std::to_string(p.total_gpus()), format_bytes(p.gpu_memory_bytes),
                           format_flops_rate(p.gpu_peak_flops_per_s), format_bandwidth(p.gpu_gpu_Bps),
                           format_bandwidth(p.cpu_Bps_per_gpu_all_active()),
                           format_bandwidth(p.nvme_read_Bps_per_gpu_all_active()), p.description});
              rows.push_back({{"name", name}, {"gpus", p.total_gpus()}, {"gpu_memory_bytes", p.gpu_memory_bytes},
                              {"peak_flops_per_s", p.gpu_peak_flops_per_s}, {"gpu_gpu_Bps", p.gpu_gpu_Bps},
                              {"cpu_Bps_per_gpu", p.cpu_Bps_per_gpu_all_active()},
                              {"nvme_read_Bps_per_gpu", p.nvme_read_Bps_per_gpu_all_active()}});
            }
            write_output("", *json ? rows.dump(2) + "\n" : render_table(t, 0));
            return 0;
          }};
}

}  // namespace memwall::cli
