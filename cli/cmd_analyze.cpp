// `memwall analyze`: the paper's closed-form analysis (Eq. 1-11) for a model on a profile, the
// Fig. 2a and Table 3 tables, and the Fig. 3 sweeps as CSV. Parses and prints; model/ computes.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "model/analysis.hpp"
#include "model/throughput.hpp"
#include "model/units.hpp"

namespace memwall::cli {
namespace {

using nlohmann::ordered_json;

struct AnalyzeFlags {
  ProfileFlags profile;
  ModelFlags model;
  TrainingConfig config;
  std::optional<int> gpus;  // unset: every GPU of the profile
  std::string table;
  std::string sweep;
  std::string peak = "70 TFLOPS";
  std::string output;
  bool json = false;
  TokensFlag tokens;
};

// The paper prints Fig. 2a with two decimals (1.83 TiB, 0.05 TiB); so do we.
std::string fixed2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string pct(double efficiency) { return format_sig(100.0 * efficiency, 3) + " %"; }

ordered_json model_json(const ModelSpec& m) {
  ordered_json j = {{"name", m.name}, {"source", m.source}, {"layers", m.layers}, {"hidden", m.hidden},
                    {"heads", m.heads}, {"seq", m.seq},     {"vocab", m.vocab}};
  if (!m.paper_gpt()) j["kind"] = m.kind_words();
  return j;
}

ordered_json analysis_json(const Analysis& a) {
  ordered_json j;
  j["profile"] = a.profile_name;
  j["model"] = model_json(a.model);
  j["config"] = {{"bsz", a.config.bsz}, {"seq", a.config.seq}, {"ci", a.config.ci}, {"gpus", a.gpus}};
  j["peak_flops_per_s"] = a.peak_flops_per_s;
  j["params"] = a.params;
  j["active_params"] = a.active_params;
  j["computation_flops"] = a.computation_flops;
  j["memory_bytes"] = {{"model_states", a.model_state_bytes},
                       {"act_ckpt", a.act_ckpt_bytes_per_gpu},
                       {"act_ckpt_all_gpus", a.act_ckpt_bytes_total},
                       {"mswm", a.mswm_bytes},
                       {"awm", a.awm_bytes}};
  j["ait"] = {{"param_grad", a.ait_param_grad}, {"optimizer", a.ait_optimizer}, {"act_ckpt", a.ait_act_ckpt}};
  ordered_json eff = ordered_json::object();
  for (const auto& e : a.efficiencies)
    eff[to_string(e.state)][e.tier] = {{"bw_Bps", e.bw_Bps}, {"efficiency", e.efficiency}, {"basis", e.basis}};
  j["efficiency"] = eff;
  ordered_json fits = ordered_json::array();
  for (const auto& f : a.fits)
    fits.push_back({{"what", f.what}, {"tier", f.tier}, {"scope", f.scope}, {"needed_bytes", f.needed_bytes},
                    {"capacity_bytes", f.capacity_bytes}, {"fits", f.fits()}});
  j["fits"] = fits;
  return j;
}

// The throughput ceiling: every transfer hidden, each GPU computing Eq. 7-8's FLOPs at the
// achievable peak (what no offload can beat; simulate and plan add the traffic).
Throughput ceiling(const Analysis& a, const HardwareProfile& p, double train_tokens) {
  TrainingConfig c = a.config;
  c.dp = std::max(1, a.gpus / c.mp);
  const double iteration_s = a.peak_flops_per_s > 0 ? a.computation_flops / a.peak_flops_per_s : 0;
  return throughput(a.model, c, p, iteration_s, a.computation_flops, train_tokens);
}

std::string analysis_text(const Analysis& a, const HardwareProfile& p, const Throughput& best) {
  std::ostringstream o;
  const ModelSpec& m = a.model;
  o << "model    " << m.name << ": " << m.layers << " layers, hidden " << m.hidden << ", " << m.heads
    << " heads, seq " << a.config.seq << " (" << m.source << ")\n";
  if (!m.note.empty()) o << "         note: " << m.note << "\n";
  o << "profile  " << p.name << ": " << p.nodes << " node(s) x " << p.gpus_per_node << " GPUs, "
    << format_bytes(p.gpu_memory_bytes) << " each; analysis over " << a.gpus << " GPUs\n";
  o << "training bsz " << format_g(a.config.bsz) << " per GPU, ci " << a.config.ci << ", achievable peak "
    << format_flops_rate(a.peak_flops_per_s) << " at hidden " << m.hidden << "\n\n";

  // The paper's GPT gets its equations; any other kind the same quantities from its operators.
  const bool gpt = m.paper_gpt();
  auto eq = [&](const char* paper, const char* other) { return std::string(gpt ? paper : other); };
  if (!gpt) o << "kind     " << m.kind_words() << ": the paper's quantities from the operator graph\n\n";
  std::string params = format_count_words(a.params);
  if (a.active_params < a.params) params += " (" + format_count_words(a.active_params) + " active)";
  o << "memory (paper Sec. 3)\n";
  o << render_table({
      {"quantity", "value", "equation"},
      {"parameters", params, eq("Eq. 1   12*nl*hd^2", "graph   every parameter (active: a token's experts)")},
      {"model states", format_bytes(a.model_state_bytes), eq("Eq. 2   240*nl*hd^2", "Eq. 2   20 B x params")},
      {"activation checkpoints, one GPU", format_bytes(a.act_ckpt_bytes_per_gpu), "Eq. 3   2*bsz*seq*hd*nl/ci"},
      {"activation checkpoints, " + std::to_string(a.gpus) + " GPUs", format_bytes(a.act_ckpt_bytes_total),
       "Eq. 3   at bsz x GPUs"},
      {"model state working memory (MSWM)", format_bytes(a.mswm_bytes),
       eq("Eq. 4   4*hd*4hd", "Eq. 4   4 B x largest linear layer (one expert)")},
      {"activation working memory (AWM)", format_bytes(a.awm_bytes),
       eq("Eq. 5   bsz*seq*ci*(16*hd+2*heads*seq)", "Eq. 5   bsz*seq*ci*(2 B x fc1+act outputs + 2*heads*seq)")},
      {"computation per GPU per iteration", format_sig(a.computation_flops / 1e15) + " PFLOP",
       eq("Eq. 7-8 2*4*bsz*seq*params", "Eq. 7-8 2*4*bsz*seq*active params")},
  });
  o << "\narithmetic intensity, flop per byte (paper Sec. 4.1)\n";
  o << render_table({
      {"state", "AIT", "equation"},
      {"parameters and gradients", format_g(a.ait_param_grad), eq("Eq. 9   seq*bsz", "Eq. 9   seq*bsz x active/all weights")},
      {"optimizer states", format_g(a.ait_optimizer), eq("Eq. 10  seq*bsz/4", "Eq. 10  seq*bsz/4 x active/all weights")},
      {"activation checkpoints", format_g(a.ait_act_ckpt),
       eq("Eq. 11  24*hd*ci", "Eq. 11  2*ci x a block's active linear weights / hd")},
  });
  o << "\nefficiency if only this state moves, without overlap (Eq. 6: ait*bw / (ait*bw + peak))\n";
  std::vector<std::vector<std::string>> rows = {{"state", "tier", "bandwidth", "efficiency", "bandwidth basis"}};
  for (const auto& e : a.efficiencies)
    rows.push_back({to_string(e.state), e.tier, format_bandwidth(e.bw_Bps), pct(e.efficiency), e.basis});
  o << render_table(rows);
  o << "\nthroughput ceiling: every transfer hidden, each GPU at the achievable peak (Eq. 7-8 FLOPs;\n"
       "MFU counts 6*params + 12*nl*hd*seq per token, no recompute: results/METRICS.md)\n  "
    << throughput_words(best) << "\n";
  o << "\nwhere it fits\n";
  rows = {{"what", "tier", "scope", "needed", "capacity", "fits"}};
  for (const auto& f : a.fits)
    rows.push_back({f.what, f.tier, f.scope, format_bytes(f.needed_bytes), format_bytes(f.capacity_bytes),
                    f.fits() ? "yes" : "no"});
  o << render_table(rows);
  return o.str();
}

// Fig. 2a as the paper prints it: bsz 32, seq 1024, ci 1 (activation memory of one node).
std::string fig2a_text(bool json) {
  const double bsz = 32;
  ordered_json rows = ordered_json::array();
  std::vector<std::vector<std::string>> table = {
      {"model", "params", "layers", "hidden", "heads", "model states", "act. ckpt", "MSWM", "AWM"}};
  for (const ModelSpec& m : fig2a_models()) {
    double params = params_eq1(m.layers, m.hidden);
    double ms = model_state_bytes_eq2(m.layers, m.hidden);
    double ck = act_ckpt_bytes_eq3(bsz, m.seq, m.hidden, m.layers, 1);
    double mswm = mswm_bytes_eq4(m.hidden);
    double awm = awm_bytes_eq5(bsz, m.seq, 1, m.hidden, m.heads);
    table.push_back({m.name, format_count_words(params), std::to_string(m.layers), std::to_string(m.hidden / 1024) + "K",
                     std::to_string(m.heads), fixed2(ms / std::pow(1024.0, 4)) + " TiB", fixed2(ck / std::pow(1024.0, 4)) + " TiB",
                     fixed2(mswm / std::pow(1024.0, 3)) + " GiB", fixed2(awm / std::pow(1024.0, 3)) + " GiB"});
    rows.push_back({{"model", m.name}, {"params", params}, {"layers", m.layers}, {"hidden", m.hidden},
                    {"heads", m.heads},
                    {"memory_bytes", {{"model_states", ms}, {"act_ckpt", ck}, {"mswm", mswm}, {"awm", awm}}}});
  }
  if (json) return ordered_json{{"table", "fig2a"}, {"bsz", bsz}, {"seq", 1024}, {"ci", 1}, {"rows", rows}}.dump(2) + "\n";
  return "Fig. 2a: memory requirements (bsz 32, seq 1024, ci 1; Eq. 1-5)\n" + render_table(table);
}

std::string table3_text(bool json) {
  ordered_json rows = ordered_json::array();
  std::vector<std::vector<std::string>> table = {{"", "V100", "10x", "100x"}};
  std::vector<std::string> devices = {"total devices"}, peak = {"achievable peak per device"},
                           slow = {"slow memory bw per device"}, agg = {"slow memory aggregate bw"},
                           opt = {"  (optimizer states alone, Eq. 10)"}, gg = {"GPU-to-GPU bw"};
  for (const Table3Row& r : table3()) {
    devices.push_back(std::to_string(r.devices));
    peak.push_back(format_flops_rate(r.peak_flops_per_s));
    slow.push_back(format_bandwidth(r.slow_memory_Bps_per_device));
    agg.push_back(format_bandwidth(r.slow_memory_aggregate_Bps));
    opt.push_back(format_bandwidth(r.optimizer_only_Bps_per_device));
    gg.push_back(format_bandwidth(r.gpu_gpu_Bps));
    rows.push_back({{"compute_multiplier", r.compute_multiplier}, {"devices", r.devices},
                    {"peak_flops_per_s", r.peak_flops_per_s},
                    {"slow_memory_Bps_per_device", r.slow_memory_Bps_per_device},
                    {"slow_memory_aggregate_Bps", r.slow_memory_aggregate_Bps},
                    {"optimizer_only_Bps_per_device", r.optimizer_only_Bps_per_device},
                    {"gpu_gpu_Bps", r.gpu_gpu_Bps}});
  }
  if (json) return ordered_json{{"table", "table3"}, {"rows", rows}}.dump(2) + "\n";
  table.insert(table.end(), {devices, peak, slow, agg, opt, gg});
  return "Table 3: bandwidth to stay efficient on 512 devices\n" + render_table(table) +
         "  slow memory: model states (20 B/param) read and written once per iteration at 90 % efficiency, bsz 2\n"
         "  GPU-to-GPU: parameters and gradients (Eq. 9) at 50 % efficiency, bsz 1\n";
}

std::string sweep_text(const std::string& which, double peak, long seq, int ci, bool json) {
  Fig3Panel panel = which == "fig3a" ? Fig3Panel::a_param_grad
                    : which == "fig3b" ? Fig3Panel::b_optimizer
                                       : Fig3Panel::c_act_ckpt;
  std::vector<SweepPoint> pts = fig3_sweep(panel, peak, seq, ci);
  if (json) {
    ordered_json rows = ordered_json::array();
    for (const auto& p : pts)
      rows.push_back({{"series", p.series}, {"bsz", p.bsz}, {"hidden", p.hidden}, {"bw_Bps", p.bw_Bps},
                      {"ait", p.ait}, {"efficiency", p.efficiency}});
    return ordered_json{{"sweep", which}, {"peak_flops_per_s", peak}, {"seq", seq}, {"ci", ci}, {"points", rows}}
               .dump(2) + "\n";
  }
  std::ostringstream o;
  o << "panel,series,bsz,hidden,seq,ci,peak_flops_per_s,bw_Bps,ait,efficiency\n";
  for (const auto& p : pts)
    o << p.panel << "," << p.series << "," << p.bsz << "," << p.hidden << "," << seq << "," << ci << ","
      << peak << "," << p.bw_Bps << "," << p.ait << "," << p.efficiency << "\n";
  return o.str();
}

// The default job: every Fig. 2a model on the profile, with where it fits and what it costs.
std::string overview_text(const HardwareProfile& p, const TrainingConfig& c, int gpus, bool json) {
  ordered_json rows = ordered_json::array();
  std::vector<std::vector<std::string>> table = {{"model", "params", "model states", "act. ckpt (all GPUs)", "MSWM",
                                                  "AWM", "states fit in", "param nvme", "optim nvme",
                                                  "ckpt cpu"}};
  for (ModelSpec m : fig2a_models()) {
    TrainingConfig cfg = c;
    Analysis a = analyze(m, cfg, p, gpus);
    std::string fits = "nowhere";
    for (const auto& f : a.fits)
      if (f.what == "model states" && f.fits()) {
        fits = f.tier;
        break;
      }
    auto eff = [&](AitState s, const char* tier) {
      for (const auto& e : a.efficiencies)
        if (e.state == s && e.tier == tier) return e.efficiency;
      return 0.0;
    };
    table.push_back({m.name, format_count_words(a.params), format_bytes(a.model_state_bytes),
                     format_bytes(a.act_ckpt_bytes_total), format_bytes(a.mswm_bytes), format_bytes(a.awm_bytes), fits,
                     pct(eff(AitState::param_grad, "nvme")), pct(eff(AitState::optimizer, "nvme")),
                     pct(eff(AitState::act_ckpt, "cpu"))});
    rows.push_back(analysis_json(a));
  }
  if (json) return ordered_json{{"profile", p.name}, {"models", rows}}.dump(2) + "\n";
  std::ostringstream o;
  const int g = gpus > 0 ? gpus : p.total_gpus();
  o << "memwall analyze: the paper's Fig. 2a models on " << p.name << " (" << p.description << ")\n";
  o << g << " GPUs, bsz " << format_g(c.bsz) << " per GPU (" << format_g(c.bsz * g) << " in all), seq "
    << c.seq << ", ci " << c.ci << "\n\n";
  o << render_table(table);
  o << "\nefficiency columns: Eq. 6 with one state offloaded at a time and no overlap; for one model in\n"
       "detail: memwall analyze --model fig2a-10T; tables: --table fig2a|table3; curves: --sweep fig3a\n";
  return o.str();
}

}  // namespace

Command add_analyze(CLI::App& app) {
  auto f = std::make_shared<AnalyzeFlags>();
  f->config.bsz = 2;  // the paper's 2-4 per GPU; 2 x 16 GPUs = Fig. 2a's 32 per DGX-2
  CLI::App* sub = app.add_subcommand(
      "analyze",
      "The paper's closed-form analysis (Eq. 1-11): memory, arithmetic intensity, efficiency per tier.\n"
      "With no model, prints every Fig. 2a model on the profile (default dgx2).");
  f->profile.add(*sub);
  f->model.add(*sub);
  add_number(*sub, "--bsz", f->config.bsz, kMaxBsz, "Micro-batch per GPU (may be fractional)");
  add_int(*sub, "--ci", f->config.ci, 1, kMaxLayers, "Transformer blocks between activation checkpoints");
  add_int(*sub, "--gpus", f->gpus, 1, kMaxGpus, "GPUs to use (default: all of the profile)");
  sub->add_option("--table", f->table, "Print a paper table instead: fig2a or table3")
      ->check(CLI::IsMember({"fig2a", "table3"}));
  sub->add_option("--sweep", f->sweep, "Write Fig. 3 efficiency-vs-bandwidth curves as CSV: fig3a, fig3b or fig3c")
      ->check(CLI::IsMember({"fig3a", "fig3b", "fig3c"}));
  sub->add_option("--peak", f->peak, "Achievable peak for --sweep")->capture_default_str();
  sub->add_option("-o,--output", f->output, "Write to this file instead of stdout (atomically)");
  f->tokens.add(*sub);
  sub->add_flag("--json", f->json, "JSON output");

  return {sub, [f]() {
            check_output_file("-o", f->output);
            std::string text;
            if (!f->table.empty() && !f->sweep.empty()) throw UsageError("--table and --sweep: give one, not both");
            if (!f->tokens.tokens.empty() && (!f->table.empty() || !f->sweep.empty() || !f->model.given()))
              throw UsageError(std::string("--tokens: the time to train is for one model (--model); not used with ") +
                               (!f->table.empty() ? "--table" : !f->sweep.empty() ? "--sweep" : "the Fig. 2a overview"));
            if (f->table == "fig2a") {
              text = fig2a_text(f->json);
            } else if (f->table == "table3") {
              text = table3_text(f->json);
            } else if (!f->sweep.empty()) {
              const double peak = parse_quantity_flag("--peak", f->peak, Dimension::flops_rate, 0, 1e21);
              const long seq = f->model.seq.value_or(1024);
              text = sweep_text(f->sweep, peak, seq, f->config.ci, f->json);
            } else {
              HardwareProfile p = f->profile.load();
              if (f->gpus && *f->gpus > p.total_gpus())
                throw UsageError("--gpus: profile " + p.name + " has " + std::to_string(p.total_gpus()) +
                                 " GPUs (" + std::to_string(p.nodes) + " node(s) x " +
                                 std::to_string(p.gpus_per_node) + "), asked for " + std::to_string(*f->gpus) +
                                 "; add nodes with --nodes");
              const int gpus = f->gpus.value_or(0);  // analyze(): 0 = every GPU of the profile
              if (f->model.given()) {
                ModelSpec m = f->model.load();
                TrainingConfig c = f->config;
                c.seq = m.seq;
                c = take(validate_ranges(c, m.layers));
                Analysis a = analyze(m, c, p, gpus);
                const Throughput best = ceiling(a, p, f->tokens.value());
                ordered_json j;
                if (f->json) {
                  j = analysis_json(a);
                  j["throughput_ceiling"] = throughput_json(best);
                }
                text = f->json ? j.dump(2) + "\n" : analysis_text(a, p, best);
              } else {
                TrainingConfig c = f->config;
                c.seq = f->model.seq.value_or(1024);
                c = take(validate_ranges(c, 80));
                text = overview_text(p, c, gpus, f->json);
              }
            }
            write_output(f->output, text);
            return 0;
          }};
}

}  // namespace memwall::cli
