// `memwall plan`: the fastest placement, micro-batch, checkpoint interval and tiling factor for a
// model on a profile, why it won, the runners-up; the largest model a strategy trains (Fig. 6);
// the reproduction tables of Fig. 6 and Fig. 7. The search and every sentence are planner/'s;
// this file only parses flags and prints.
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "exec/adam/cpu_adam.hpp"
#include "exec/engine/engine.hpp"
#include "cli/commands.hpp"
#include "sim/replay.hpp"
#include "model/schedule.hpp"
#include "model/units.hpp"
#include "planner/deepspeed.hpp"
#include "planner/megatron.hpp"
#include "planner/plan_file.hpp"
#include "planner/recommend.hpp"
#include "planner/reproduce.hpp"
#include "cli/fix_flags.hpp"
#include "planner/search.hpp"

namespace memwall::cli {
namespace {

using namespace memwall::planner;

struct PlanFlags {
  ProfileFlags profile;
  ModelFlags model;
  std::string objective = "throughput";
  std::vector<std::string> fix;
  std::string output;
  std::string deepspeed;
  std::string megatron;  // --megatron: the pretrain_gpt.py script
  std::string nvme_path = "/local_nvme";
  std::string target;     // --for: memwall, deepspeed (empty: deepspeed with --deepspeed, else memwall)
  std::string precision;  // --precision of the export (empty: the profile's GPU decides)
  std::string max_alloc;
  bool json = false;
  bool max_model_size = false;
  std::string strategy;
  std::string reproduce;
  std::string check;
  int runners = 5;
  int simulate_top = 0;  // simulations of tiled paper-sized schedules take seconds to minutes each
  bool allow_dpu = false;
  bool exhaustive = false;  // --exhaustive: check every candidate's memory fit (no branch and bound)
  long global_batch = 0;  // 0: unconstrained
  WhatIf what_if;
  double grad_clip = 0;
  TokensFlag tokens;
};

nlohmann::ordered_json placement_json(const Placement& pl) {
  nlohmann::ordered_json j = {{"fetch", pl.fetch == ParamFetch::broadcast ? "broadcast" : "allgather"}};
  for (State s : {State::param16, State::grad16, State::optim32, State::act_ckpt})
    j[to_string(s)] = {{"tier", to_string(pl.of(s).tier)}, {"partitioned", pl.of(s).partitioned}};
  return j;
}

nlohmann::ordered_json evaluated_json(const Evaluated& e) {
  const TrainingConfig& c = e.candidate.config;
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const LimitCheck& lc : e.fit.checks) {
    nlohmann::ordered_json parts = nlohmann::ordered_json::object();
    for (const Part& p : lc.parts) parts[p.what] = p.bytes;
    checks.push_back({{"resource", resource_key(lc.resource)}, {"scope", lc.scope}, {"needed_bytes", lc.needed_bytes},
                      {"capacity_bytes", lc.capacity_bytes}, {"fits", lc.fits()}, {"moment", lc.moment},
                      {"parts", parts}});
  }
  nlohmann::ordered_json j = {{"strategy", placement_label(e.candidate.placement)},
                              {"placement", placement_json(e.candidate.placement)},
                              {"bsz", c.bsz}, {"ci", c.ci}, {"tiling_factor", c.tiling_factor}, {"mp", c.mp},
                              {"dp", c.dp}, {"pp", c.pp}, {"virtual_stages", c.virtual_stages}, {"grad_accum", c.grad_accum}, {"global_batch", global_batch(c)},
                              {"prefetch_depth", c.prefetch_depth},
                              {"optimizer_overlap", to_string(c.optimizer_overlap)},
                              {"grad_clip", c.grad_clip},
                              {"onebit_adam", c.what_if.onebit_adam},
                              {"attention_density", c.what_if.attention_density},
                              {"tflops_per_gpu", e.time.tflops_per_gpu}, {"iteration_s", e.time.iteration_s},
                              {"samples_per_s", e.time.samples_per_s},
                              {"time_s", {{"compute", e.time.compute_s}, {"param_grad_traffic", e.time.param_grad_s},
                                          {"act_ckpt_traffic", e.time.act_ckpt_s}, {"act_ckpt_loads", e.time.act_ckpt_load_s}, {"optimizer", e.time.optimizer_s},
                                          {"refresh", e.time.refresh_s}, {"param_gather", e.time.param_gather_s},
                                          {"mp_allreduce", e.time.mp_allreduce_s},
                                          {"all_to_all", e.time.all_to_all_s},
                                          {"pipeline_p2p", e.time.p2p_s}, {"pipeline_bubble", e.time.bubble_s},
                                          {"grad_norm", e.time.grad_norm_s},
                                          {"exposed", e.time.exposed_s}}},
                              {"fits", e.fit.fits()}, {"binding", resource_key(e.fit.binding().resource)},
                              {"checks", checks}};
  j["ranked_by"] = e.ranked_by();
  if (e.simulated_s) {
    j["simulated_iteration_s"] = *e.simulated_s;
    j["simulated_tflops_per_gpu"] = *e.simulated_tflops_per_gpu();
  }
  return j;
}

std::string config_words(const Evaluated& e) {
  const TrainingConfig& c = e.candidate.config;
  return placement_label(e.candidate.placement) + ", bsz " + format_g(c.bsz) + ", ci " + std::to_string(c.ci) +
         ", tiling " + std::to_string(c.tiling_factor) + ", mp " + std::to_string(c.mp) + ", dp " + std::to_string(c.dp) +
         (c.pp > 1 ? ", pp " + std::to_string(c.pp) +
                         (c.virtual_stages > 1 ? " (interleaved 1F1B, " + std::to_string(c.virtual_stages) + " chunks each)"
                                               : std::string(" (1F1B)"))
                   : std::string()) +
         (c.ep > 1 ? ", ep " + std::to_string(c.ep) + " (experts split, tokens all-to-all)" : std::string()) +
         (c.grad_accum > 1 ? ", grad-accum " + std::to_string(c.grad_accum) : std::string()) +
         (c.optimizer_overlap == OptimizerOverlap::none ? std::string()
          : c.optimizer_overlap == OptimizerOverlap::backward
              ? std::string(", optimizer overlapped with backward")
              : ", delayed parameter update (one step stale: changes the training dynamics)") +
         (c.what_if.onebit_adam ? ", 1-bit Adam (compression stage)" : "") +
         (c.what_if.attention_density < 1 ? ", attention density " + format_g(c.what_if.attention_density) : "");
}

double parse_alloc(const std::string& text) {
  if (text.empty()) return 0;
  return parse_quantity_flag("--max-alloc", text, Dimension::bytes, 4096, quantity_range(Dimension::bytes).max);
}

int run_reproduce(const PlanFlags& f) {
  if (f.reproduce != "fig6" && f.reproduce != "fig7")
    throw UsageError("--reproduce: expected fig6 or fig7, got \"" + f.reproduce + "\"");
  HardwareProfile p = f.profile.load();
  const double alloc = f.max_alloc.empty() ? 2.0 * (1 << 30) : parse_alloc(f.max_alloc);
  Reproduction r = take(f.reproduce == "fig6" ? reproduce_fig6(p) : reproduce_fig7(p, alloc));
  if (!f.output.empty()) {
    write_output((std::filesystem::path(f.output) / (f.reproduce + ".csv")).string(), r.csv);
    write_output((std::filesystem::path(f.output) / (f.reproduce + ".md")).string(), r.markdown);
  }
  write_output("", f.json ? nlohmann::ordered_json{{"figure", f.reproduce}, {"csv", r.csv}}.dump(1) + "\n" : r.markdown);
  return 0;
}

// Loads a plan file, cross-checks it against the profile and re-checks its memory fit.
int run_check(const PlanFlags& f) {
  HardwareProfile p = f.profile.load();
  Plan plan = take(load_plan(f.check, &p));
  take(check_schedule_size(plan.model, plan.candidate.placement, plan.candidate.config, p));
  FitOptions o;
  o.max_alloc_bytes = parse_alloc(f.max_alloc);
  Evaluated e = evaluate(plan.model, plan.candidate, p, o);
  nlohmann::ordered_json j = evaluated_json(e);
  if (f.json) {
    write_output("", j.dump(1) + "\n");
  } else {
    std::string out = "plan ok: " + f.check + ": " + plan.model.name + " on " + p.name + ", " + config_words(e) + ", " +
                      format_sig(e.time.tflops_per_gpu) + " TFLOPS per GPU predicted; " +
                      (e.fit.fits() ? "fits: " : "does not fit: ") + e.fit.binding().sentence() + "\n";
    write_output("", out);
  }
  return e.fit.fits() ? 0 : 1;
}

int run_max_model(const PlanFlags& f) {
  if (f.strategy.empty()) throw UsageError("--strategy: missing (--max-model-size needs a strategy, e.g. zero_inf_nvme)");
  if (!f.fix.empty()) throw UsageError("--fix: not used with --max-model-size (the strategy fixes the placement)");
  if (f.model.given()) throw UsageError("--model: not used with --max-model-size (the planner grows the model)");
  HardwareProfile p = f.profile.load();
  FitOptions o;
  o.max_alloc_bytes = parse_alloc(f.max_alloc);
  MaxModel mm = take(max_model_size(f.strategy, p, o));
  if (f.json) {
    nlohmann::ordered_json j = {{"strategy", mm.strategy}, {"profile", p.name}, {"gpus", p.total_gpus()},
                                {"max_params", mm.max_params}, {"layers", mm.layers}, {"hidden", mm.hidden},
                                {"heads", mm.heads}, {"plan", evaluated_json(mm.plan)}};
    if (mm.table4_row >= 0)
      j["table4_model"] = {{"label", mm.table4_label}, {"params", mm.table4_params}, {"layers", mm.table4_layers},
                           {"hidden", mm.table4_hidden}};
    write_output(f.output, j.dump(1) + "\n");
    return 0;
  }
  std::ostringstream o2;
  o2 << "memwall plan --max-model-size: " << mm.strategy << " on " << p.name << " (" << p.total_gpus() << " GPUs)\n"
     << "  largest model: " << format_count(mm.max_params) << " parameters (Eq. 1), " << mm.layers << " layers x hidden "
     << mm.hidden << ", " << mm.heads << " heads (grown along Table 4's rows)\n"
     << "  of Table 4's models (the sizes the paper tried): "
     << (mm.table4_row >= 0 ? mm.table4_label + " (" + std::to_string(mm.table4_layers) + " layers x hidden " +
                                  std::to_string(mm.table4_hidden) + ", " + format_count(mm.table4_params) + " by Eq. 1)"
                            : std::string("none fits"))
     << "\n"
     << "  fits with " << config_words(mm.plan) << ": " << mm.plan.fit.binding().sentence() << "\n";
  write_output(f.output, o2.str());
  return 0;
}

int run_plan(const PlanFlags& f) {
  if (f.objective != "throughput" && f.objective != "max-model")
    throw UsageError("--objective: expected throughput or max-model, got \"" + f.objective + "\"");
  const double train_tokens = f.tokens.value();
  HardwareProfile p = f.profile.load();
  if (!f.model.given()) throw UsageError("--model: missing (or give --layers, --hidden and --heads)");
  ModelSpec m = f.model.load();
  // The chosen plan's schedule is built to check it: the model alone must leave room for that.
  {
    TrainingConfig one;
    one.seq = m.seq;
    take(validate(one, m.layers));
  }
  // --strategy X is --fix strategy=X, as simulate and run read it: the placement is pinned, the
  // rest searched
  std::vector<std::string> fix = f.fix;
  if (!f.strategy.empty()) {
    for (const std::string& x : fix)
      if (x.starts_with("strategy="))
        throw UsageError("--strategy: give --strategy " + f.strategy + " or --fix " + x + ", not both");
    take(preset(f.strategy));  // "--strategy: unknown strategy ..." rather than --fix's words
    fix.push_back("strategy=" + f.strategy);
  }
  Fixes fixes = take(parse_fixes(fix));
  if (f.grad_clip > 0 && fixes.overlap == OptimizerOverlap::backward)
    throw UsageError("--fix optimizer_overlap=backward: not with --grad-clip: clipping needs the global gradient norm, "
                     "known only once backward has made the last gradient, and this overlap updates before that");
SearchSpace space = take(make_space(m, p, fixes));
  if (f.target.empty() && !f.deepspeed.empty() && !f.megatron.empty())
    throw UsageError("--for: --deepspeed and --megatron plan for different runners; say which with --for deepspeed, "
                     "--for megatron or --for memwall");
  const std::string target = !f.target.empty()      ? f.target
                             : !f.deepspeed.empty() ? "deepspeed"
                             : !f.megatron.empty()  ? "megatron"
                                                    : "memwall";
  if (target != "memwall" && target != "deepspeed" && target != "megatron")
    throw UsageError("--for: expected memwall, deepspeed or megatron, got \"" + f.target + "\"");
  if (f.allow_dpu && target == "megatron")
    throw UsageError("--allow-dpu: Megatron-LM steps the optimizer after backward (planning --for megatron)");
  if (target == "megatron") space = take(megatron_space(std::move(space), m));
  if (f.allow_dpu && target == "deepspeed")
    throw UsageError("--allow-dpu: DeepSpeed has no delayed parameter update (planning --for deepspeed)");
  if (f.allow_dpu && !fixes.overlap) space.overlaps.push_back(OptimizerOverlap::dpu);
  if (target == "deepspeed") space = take(deepspeed_space(std::move(space), fixes.overlap.has_value()));
  DeepSpeedOptions ds_options;
  ds_options.nvme_path = f.nvme_path;
  ds_options.precision = take(deepspeed_precision(p, f.precision));
  space.what_if = f.what_if;
  space.grad_clip = f.grad_clip;
  // what `memwall run` executes, where it runs this profile's plans
  const std::string not_executed = target == "memwall" && !p.executor_backend.empty() ? narrow_to_executor(space, fixes) : "";
if (f.global_batch > 0) space = take(with_global_batch(std::move(space), f.global_batch));
  SearchOptions so;
  // the candidates --simulate-top could not simulate, and why (by candidate_key)
  std::map<std::string, std::pair<Candidate, std::string>> not_simulated;
  so.objective = f.objective == "max-model" ? Objective::max_model : Objective::throughput;
  so.fit.max_alloc_bytes = parse_alloc(f.max_alloc);
  so.keep = f.runners + 1;
  so.prune = !f.exhaustive;
  if (f.simulate_top > 0) {
    // Re-rank the best few by simulating one iteration each (one SimGrid engine per child process).
    so.refine_top = f.simulate_top;
    so.refine = [&m, &p, &not_simulated](const Candidate& c) -> std::optional<double> {
      // with the executor's sizes where it runs p
      const sim::RankingReplay r =
          sim::replay_for_ranking(m, c.placement, c.config, p, take(exec::schedule_sizes(p, m, c.placement, c.config)));
      if (!r.iteration_s) not_simulated[candidate_key(c)] = {c, r.why_not};
      return r.iteration_s;
    };
  }
  // The detailed accounting confirms the analytic choice (planner::recommend, as the GUI's Plan
  // tab): build_schedule's per-rank peaks, with the executor's buffer sizes when `memwall run`
  // executes this profile's plans (executor: in the profile).
  const SizesFn sizes = [&](const Candidate& c) { return exec::schedule_sizes(p, m, c.placement, c.config); };
  const Recommendation rec = recommend(m, p, space, fixes, so, sizes);
  const SearchResult& r = rec.result();
  const std::string head = m.name + " (" + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.hidden) +
                           ", " + format_count(model_param_count(m)) + " params) on " + p.name + " (" +
                           std::to_string(p.total_gpus()) + " GPUs, " + std::to_string(p.nodes) + " node(s))" +
                           (target == "deepspeed"  ? ", for DeepSpeed (only what it runs as planned)"
                            : target == "megatron" ? ", for Megatron-LM (only what it runs)"
                                                   : "");

  if (!r.fits()) {
    if (f.json) {
      nlohmann::ordered_json j = {{"model", m.name}, {"profile", p.name}, {"fits", false}, {"shortfall", rec.shortfall},
                                  {"candidates", r.space_size}, {"evaluated", r.evaluated}};
      if (r.closest) j["closest"] = evaluated_json(*r.closest);
      write_output("", j.dump(1) + "\n");
    } else {
      std::cerr << one_line("memwall plan: " + m.name + " fits nowhere on " + p.name + ": " + rec.shortfall) << "\n";
    }
    return 1;
  }

  const bool sched_fits = rec.fits();
  const Evaluated& best = sched_fits ? *rec.chosen : r.top.front();
  const std::string& sched_line = rec.schedule_check;
  const std::vector<std::string>& why = rec.explanation;
  const std::vector<const Evaluated*> runners = runners_up(r, best, f.runners, rec.checked.rejected_keys);

  Plan plan;
  plan.profile = p.name;
  plan.nodes = p.nodes;
  plan.gpus = best.candidate.config.dp * best.candidate.config.mp * best.candidate.config.pp;
  if (f.global_batch > 0) plan.global_batch = f.global_batch;
  plan.objective = f.objective;
  plan.model = m;
  plan.candidate = best.candidate;
  plan.candidate.placement.name = placement_label(best.candidate.placement);
  plan.predicted_iteration_s = best.time.iteration_s;
  plan.predicted_tflops_per_gpu = best.time.tflops_per_gpu;
  plan.simulated_iteration_s = best.simulated_s;
  plan.simulated_tflops_per_gpu = best.simulated_tflops_per_gpu();
  plan.ranking = best.ranked_by();
  std::optional<DeepSpeedExport> ds;
  // the companion note beside the config (none when the config goes to stdout: the output has it)
  const std::string ds_notes_path = f.deepspeed == "-" ? std::string() : f.deepspeed + ".notes.txt";
  if (!f.deepspeed.empty()) ds = take(deepspeed_export(m, best.candidate, ds_options));
  std::optional<MegatronExport> mg;
  const std::string mg_notes_path = f.megatron == "-" ? std::string() : f.megatron + ".notes.txt";
  if (!f.megatron.empty()) mg = take(megatron_export(m, best.candidate, p, ds_options.precision));

  // The throughput of the time that ranked the plan: simulated when it was, else analytic.
  const double ranked_s = best.simulated_s ? *best.simulated_s : best.time.iteration_s;
  const Throughput tp = throughput(m, best.candidate.config, p, ranked_s,
                                   best.time.tflops_per_gpu * 1e12 * best.time.iteration_s, train_tokens);
  std::string out;
  if (f.json) {
    nlohmann::ordered_json j = evaluated_json(best);
    j["throughput"] = throughput_json(tp);
    j["throughput"]["from"] = best.ranked_by();
    j["model"] = m.name;
    j["profile"] = p.name;
    j["for"] = target;
    j["explanation"] = why;
    nlohmann::ordered_json ru = nlohmann::ordered_json::array();
    for (const Evaluated* e : runners) ru.push_back(evaluated_json(*e));
    j["runners_up"] = ru;
    if (!not_executed.empty()) j["not_searched_for_the_executor"] = not_executed;
    j["search"] = {{"candidates", r.space_size}, {"evaluated", r.evaluated}, {"pruned", r.pruned}, {"elapsed_s", r.elapsed_s},
                   {"ranking", best.ranked_by()}, {"simulate_top", f.simulate_top}};
    if (f.simulate_top > 0) {
      nlohmann::ordered_json ns = nlohmann::ordered_json::array();
      for (const auto& [key, why] : not_simulated) {
        ns.push_back({{"strategy", placement_label(why.first.placement)}, {"bsz", why.first.config.bsz},
                      {"ci", why.first.config.ci}, {"tiling_factor", why.first.config.tiling_factor},
                      {"mp", why.first.config.mp}, {"pp", why.first.config.pp}, {"why", why.second}});
      }
      j["search"]["not_simulated"] = ns;
    }
    j["schedule_check"] = {{"fits", sched_fits}, {"text", sched_line}};
    j["global_batch_fixed"] = f.global_batch > 0;
    if (ds)
      j["deepspeed"] = {{"config", f.deepspeed}, {"notes", ds_notes_path}, {"stage", ds->stage},
                        {"planned_stage", ds->planned_stage}, {"differences", ds->differences},
                        {"code_changes", ds->code_changes}};
    if (mg)
      j["megatron"] = {{"script", f.megatron}, {"notes", mg_notes_path}, {"nodes", mg->nodes},
                       {"gpus_per_node", mg->gpus_per_node}, {"env", mg->env}, {"args", mg->args},
                       {"differences", mg->differences}, {"user_changes", mg->user_changes}};
    out = j.dump(1) + "\n";
  } else {
    std::ostringstream o;
    const TimeBreakdown& t = best.time;
    o << "memwall plan: " << head << "\n";
    if (!not_executed.empty())
      o << "(not searched: " << not_executed << ": memwall run, which executes " << p.name
        << "'s plans, runs no expert parallelism; --fix ep=N plans it for simulate)\n";
    o << "chosen: " << config_words(best) << "\n"
      << "  " << format_sig(t.tflops_per_gpu) << " TFLOPS per GPU, iteration " << format_sig(t.iteration_s) << " s = compute "
      << format_sig(t.compute_s) << " s + exposed " << format_sig(t.exposed_s) << " s (parameter/gradient traffic "
      << format_sig(t.param_grad_s) << " s and checkpoint saves " << format_sig(t.act_ckpt_s - t.act_ckpt_load_s)
      << " s behind compute; checkpoint loads " << format_sig(t.act_ckpt_load_s) << " s; optimizer "
      << format_sig(t.optimizer_s) << " s";
    if (t.refresh_s > 0) o << ", parameter refresh " << format_sig(t.refresh_s) << " s";
    if (t.param_gather_s > 0) o << ", parameters all-gathered after the step " << format_sig(t.param_gather_s) << " s";
    const OptimizerOverlap ov = best.candidate.config.optimizer_overlap;
    if (ov != OptimizerOverlap::none)
      o << (ov == OptimizerOverlap::backward ? " beside backward and recompute"
                                             : " beside the next forward and backward, then the refresh");
    if (t.mp_allreduce_s > 0) o << ", tensor-slicing all-reduces " << format_sig(t.mp_allreduce_s) << " s";
    if (t.all_to_all_s > 0) o << ", experts' all-to-alls " << format_sig(t.all_to_all_s) << " s";
    if (t.grad_norm_s > 0) o << ", gradient norm " << format_sig(t.grad_norm_s) << " s";
    if (t.bubble_s > 0)
      o << ", pipeline bubble " << format_sig(t.bubble_s) << " s and stage-to-stage traffic " << format_sig(t.p2p_s)
        << " s";
    o << ") [analytic]\n";
    if (best.simulated_s)
      o << "  " << format_sig(*best.simulated_tflops_per_gpu()) << " TFLOPS per GPU, iteration "
        << format_sig(*best.simulated_s) << " s [simulated: memwall simulate, one iteration]: the ranking that chose it\n";
    else if (f.simulate_top > 0) {
      const auto why = not_simulated.find(candidate_key(best.candidate));
      o << "  not simulated ("
        << (why != not_simulated.end() ? why->second.second
                                       : "it ranked below the " + std::to_string(f.simulate_top) +
                                             " simulated, which the schedule check or their simulation set aside")
        << "): chosen by the analytic estimate\n";
    }
    o << "  " << global_batch_words(best.candidate.config, f.global_batch > 0, p) << "\n";
    o << "  " << throughput_words(tp) << " [" << best.ranked_by() << "]\n";
    o << "  memory:";
    for (const LimitCheck& lc : best.fit.checks)
      if (lc.needed_bytes > 0) o << " " << lc.sentence() << ";";
    o << "\nwhy it won:\n";
    for (const std::string& w : why) o << "  - " << w << "\n";
    if (!runners.empty()) {
      o << "runners-up:\n";
      std::vector<std::vector<std::string>> rows = {
          {"strategy", "bsz", "ci", "tiling", "mp", "optimizer", "TFLOPS/GPU", "iteration s", "binding limit"}};
      if (f.simulate_top > 0) rows[0].insert(rows[0].begin() + 8, "simulated s");
      if (f.global_batch > 0) rows[0].insert(rows[0].begin() + 5, {"dp", "accum"});
      for (const Evaluated* ep : runners) {
        const Evaluated& e = *ep;
        const TrainingConfig& c = e.candidate.config;
        rows.push_back({placement_label(e.candidate.placement), format_g(c.bsz), std::to_string(c.ci),
                        std::to_string(c.tiling_factor), std::to_string(c.mp), to_string(c.optimizer_overlap),
                        format_sig(e.time.tflops_per_gpu),
                        format_sig(e.time.iteration_s), e.fit.binding().sentence()});
        if (f.simulate_top > 0) rows.back().insert(rows.back().begin() + 8, e.simulated_s ? format_sig(*e.simulated_s) : "-");
        if (f.global_batch > 0)
          rows.back().insert(rows.back().begin() + 5, {std::to_string(c.dp), std::to_string(c.grad_accum)});
      }
      o << render_table(rows, 2);
    }
    o << "search: " << r.space_size << " candidates in the space, " << r.evaluated << " checked"
      << (f.global_batch > 0 ? " (micro-batches that divide the global batch)" : " (larger bsz pruned once one misses)")
      << (r.pruned > 0 ? ", " + std::to_string(r.pruned) + " ranked out by time alone" : std::string())
      << ", " << format_sig(r.elapsed_s * 1e3) << " ms; "
      << (f.simulate_top > 0
              ? "the best " + std::to_string(f.simulate_top) + " re-ranked by simulation (memwall simulate); ranking " +
                    best.ranked_by() + " chose the plan"
              : std::string("ranking analytic (--simulate-top 0)"))
      << "\n";
    for (const auto& [key, why] : not_simulated) {
      const TrainingConfig& c = why.first.config;
      o << "  not simulated: " << placement_label(why.first.placement) << ", bsz " << format_g(c.bsz) << ", ci " << c.ci
        << ", tiling " << c.tiling_factor << ", mp " << c.mp << (c.pp > 1 ? ", pp " + std::to_string(c.pp) : "")
        << (c.virtual_stages > 1 ? " x " + std::to_string(c.virtual_stages) + " chunks" : "") << ": " << why.second
        << "\n";
    }
    o << sched_line << "\n";
    if (ds) {
      o << "deepspeed: " << f.deepspeed << " (ZeRO stage " << ds->stage << ")"
        << (ds_notes_path.empty() ? std::string() : " and its note " + ds_notes_path) << ":\n";
      for (const std::string& d : ds->differences) o << "  differs from the plan: " << d << "\n";
      for (const std::string& c : ds->code_changes) o << "  your script must: " << c << "\n";
    }
    if (mg) {
      o << "megatron: " << f.megatron << " (torchrun on " << mg->nodes << " node(s) x " << mg->gpus_per_node
        << " GPUs, pretrain_gpt.py)" << (mg_notes_path.empty() ? std::string() : " and its note " + mg_notes_path)
        << ":\n";
      for (const std::string& d : mg->differences) o << "  differs from the plan: " << d << "\n";
    }
    if (!ds && !mg && (best.candidate.config.tiling_factor > 1 || best.candidate.config.mp > 1)) {
      o << "note: tiling and tensor slicing are model code in DeepSpeed (TiledLinear, Megatron), not config keys\n";
    }
    out = o.str();
  }
  if (!sched_fits) {
    // the analytic model said yes, the detailed schedule no, at every micro-batch: write nothing
    std::cerr << one_line("memwall plan: " + rec.shortfall) << "\n";
    if (f.json) write_output("", out);
    return 1;
  }
  // Everything computed: now write, plan and config first so stdout comes last.
  if (!f.output.empty()) write_output(f.output, plan_yaml(plan));
  if (ds) {
    write_output(f.deepspeed, ds->config.dump(2) + "\n");
    if (!ds_notes_path.empty()) write_output(ds_notes_path, ds->notes());
  }
  if (mg) {
    write_output(f.megatron, mg->script());
    if (!mg_notes_path.empty()) write_output(mg_notes_path, mg->notes());
  }
  write_output("", out);
  return 0;
}

}  // namespace

Command add_plan(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "The fastest way to train a model on a profile, and whether it fits at all: searches placements\n"
      "(Table 2 presets and per-state tiers), micro-batch, checkpoint interval, tiling factor and tensor\n"
      "slicing, ranks by analytic iteration time (Sec. 4-6), optionally re-ranks the best few by simulation\n"
      "(--simulate-top N) and says why the plan won. Also the largest\n"
      "model a strategy trains (--max-model-size, Fig. 6) and the Fig. 6 / Fig. 7 tables (--reproduce).");
  f->profile.add(*sub);
  f->profile.add_gpus(*sub);
  f->model.add(*sub);
  sub->add_option("--objective", f->objective, "throughput (most samples/s) or max-model (most memory headroom)")
      ->capture_default_str();
  sub->add_option("--fix", f->fix,
                  "Pin one dimension: strategy=zero3, param16|grad16|optim32|act_ckpt=gpu|cpu|nvme, fetch=allgather|"
                  "broadcast, bsz=N, ci=N, tiling=N, mp=N, pp=N, ep=N, prefetch_depth=N, optimizer_overlap=none|backward|dpu "
                  "(repeatable)");
  sub->add_flag("--allow-dpu", f->allow_dpu,
                "Also search ZeRO-Offload's delayed parameter update (--optimizer-overlap dpu): faster when CPU Adam "
                "is the longest phase, but the parameters are one step stale after the warm-up, which changes the "
                "training dynamics (the default search keeps none and backward, both exact)");
  add_what_if_flags(*sub, f->what_if);
  add_grad_clip_flag(*sub, f->grad_clip);
  sub->add_option("-o,--output", f->output,
                  "Plan YAML to write (with --reproduce: the directory for CSV and Markdown, e.g. results/planner)");
  sub->add_option("--deepspeed", f->deepspeed,
                  "Write the DeepSpeed JSON config of the plan here, and beside it FILE.notes.txt: where DeepSpeed "
                  "runs it differently (stage 3 for NVMe) and the code changes it needs (checkpointing, TiledLinear, mpu);\n"
                  "implies --for deepspeed");
  sub->add_option("--megatron", f->megatron,
                  "Write the Megatron-LM command of the plan here (a shell script: torchrun ... pretrain_gpt.py with\n"
                  "tensor/pipeline parallel sizes, batch, recomputation, distributed optimizer), and beside it\n"
                  "FILE.notes.txt: where Megatron-LM runs it differently and what you must supply (implies --for megatron)");
  sub->add_option("--nvme-path", f->nvme_path, "nvme_path in the DeepSpeed config")->capture_default_str();
  sub->add_option("--for", f->target,
                  "Plan for what runs it: memwall (its schedule: CPU Adam may overlap backward, any placement),\n"
                  "deepspeed (only what stock DeepSpeed runs as planned: the CPU optimizer after backward as its\n"
                  "step() runs it, NVMe and parameter offload in stage 3, no pipeline stages) or megatron (no\n"
                  "parameter partitioning or offload, no NVMe, layers and heads split evenly). Default: deepspeed\n"
                  "with --deepspeed, megatron with --megatron, memwall otherwise");
  sub->add_option("--precision", f->precision,
                  "16-bit type of the DeepSpeed and Megatron-LM exports: bf16 or fp16 (default: bf16 where the\n"
                  "profile's GPU has it, gpu.bf16; fp16 on V100)");
  sub->add_option("--max-alloc", f->max_alloc,
                  "Largest contiguous GPU allocation, e.g. 2 GiB (Sec. 8.5's fragmentation; default: no limit, 2 GiB "
                  "for --reproduce fig7)");
  add_int(*sub, "--runners", f->runners, 0, 100, "Runners-up to show");
  sub->add_flag("--exhaustive", f->exhaustive,
                "Check the memory fit of every candidate: the same plan, without the search's branch and bound\n"
                "(which skips candidates the time alone ranks behind the best so far) and, on profiles an executor\n"
                "runs, with every candidate's schedule built (not the memory model's closed form); for checking them");
  f->tokens.add(*sub);
  add_int(*sub, "--global-batch", f->global_batch, 1, long(kMaxBsz) * kMaxGradAccum,
                  "Samples per optimizer step, fixed: every candidate trains bsz x grad-accum x dp = N, with the\n"
                  "largest dp (at most every GPU / mp) that divides N / bsz and gradient accumulation for the rest.\n"
                  "Default: unconstrained (dp = every GPU / mp, no accumulation; the global batch follows bsz)")
      ->default_str("");
  add_int(*sub, "--simulate-top", f->simulate_top, 0, 64,
          "Re-rank the best N analytic candidates by simulating one iteration each (memwall simulate; seconds to "
          "minutes per candidate on paper-sized models). 0: analytic only");
  sub->add_flag("--max-model-size", f->max_model_size, "The largest model --strategy trains on the profile (Fig. 6)");
  sub->add_option("--strategy", f->strategy,
                  "Pin the placement preset (the same as --fix strategy=NAME; the planner searches the rest);\n"
                  "with --max-model-size, the strategy whose largest model is asked for");
  sub->add_option("--reproduce", f->reproduce, "fig6 or fig7: the paper's table beside memwall's (CSV + Markdown into -o DIR)");
  sub->add_option("--check", f->check, "Load a plan YAML, cross-check it against --profile and re-check its fit");
  sub->add_flag("--json", f->json, "JSON: strategy, bsz, ci, tiling_factor, tflops_per_gpu, fits, checks, runners_up ...");
  return {sub, [f]() {
            // --deepspeed and --megatron export a plan: nothing to export from a table, a check or the
            // largest model
            for (const auto& [flag, path] : {std::pair{"--deepspeed", f->deepspeed}, std::pair{"--megatron", f->megatron}})
              if (!path.empty() && (!f->reproduce.empty() || !f->check.empty() || f->max_model_size))
                throw UsageError(std::string(flag) + ": exports a plan; not used with " +
                                 (!f->reproduce.empty() ? "--reproduce" : !f->check.empty() ? "--check" : "--max-model-size"));
            if ((f->target == "megatron" && !f->deepspeed.empty()) || (f->target == "deepspeed" && !f->megatron.empty()))
              throw UsageError(std::string(f->target == "megatron" ? "--deepspeed" : "--megatron") + ": a plan --for " +
                               f->target + " is not one " + (f->target == "megatron" ? "DeepSpeed" : "Megatron-LM") +
                               " runs as planned; drop --for, or the export");
            // each output its own file: -o, the exports and the notes beside them
            std::vector<std::pair<std::string, std::string>> outs;  // flag, path
            if (f->reproduce.empty() && !f->output.empty() && f->output != "-") outs.push_back({"-o", f->output});
            for (const auto& [flag, path] : {std::pair{"--deepspeed", f->deepspeed}, std::pair{"--megatron", f->megatron}})
              if (!path.empty() && path != "-") {
                outs.push_back({flag, path});
                outs.push_back({flag, path + ".notes.txt"});
              }
            for (size_t i = 0; i < outs.size(); ++i)
              for (size_t j = 0; j < i; ++j)
                if (std::filesystem::absolute(outs[i].second).lexically_normal() ==
                    std::filesystem::absolute(outs[j].second).lexically_normal())
                  throw UsageError(outs[i].first + ": " + outs[i].second + " is also the file " + outs[j].first +
                                   " writes; give each output its own name");
            // Destinations before any work (a search can take minutes): the folder --reproduce writes
            // into, or the files -o and --deepspeed name.
            if (!f->reproduce.empty() && !f->output.empty()) make_output_folder("-o", f->output);
            if (f->reproduce.empty()) check_output_file("-o", f->output);
            check_output_file("--deepspeed", f->deepspeed);
            if (!f->deepspeed.empty() && f->deepspeed != "-") check_output_file("--deepspeed", f->deepspeed + ".notes.txt");
            check_output_file("--megatron", f->megatron);
            if (!f->megatron.empty() && f->megatron != "-") check_output_file("--megatron", f->megatron + ".notes.txt");
            if (!f->tokens.tokens.empty() && (!f->reproduce.empty() || !f->check.empty() || f->max_model_size))
              throw UsageError(std::string("--tokens: the time to train is part of a plan; not used with ") +
                               (!f->reproduce.empty() ? "--reproduce" : !f->check.empty() ? "--check" : "--max-model-size"));
            if (!f->reproduce.empty()) return run_reproduce(*f);
            if (!f->check.empty()) return run_check(*f);
            if (f->max_model_size) return run_max_model(*f);
            return run_plan(*f);
          }};
}

}  // namespace memwall::cli
