// `memwall validate`: executes a few iterations of a run (exec/engine, as `memwall run`) and
// replays the same schedule on the simulator (sim/, as `memwall simulate`), then prints where they
// agree and where they part: iteration time, time per phase, busy time per resource, and the steps
// whose start times differ most, by step id. Both timelines go through model/timeline's
// overlap_report, so measured and simulated are measured the same way. Parses, runs and prints.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "exec/adam/host_cores.hpp"
#include "cli/run_setup.hpp"
#include "exec/adam/cpu_adam.hpp"
#include "exec/engine/collectives.hpp"
#include "exec/engine/engine.hpp"
#include "exec/engine/training.hpp"
#include "exec/gpt/gpt.hpp"
#include "model/timeline.hpp"
#include "model/units.hpp"
#include "sim/replay.hpp"

namespace memwall::cli {
namespace {

struct ValidateFlags {
  RunInputs in;
  std::string trace_dir;
  int top = 10;
  bool json = false;
};

// One time per step of the GPU `gpu` from trace events (a simulated step may be several
// activities): the earliest start and the latest end of its events. Only that GPU's: a pipeline's
// other stages (or the broadcast variant's other ranks) replayed beside it number their own steps
// from 0 too.
std::vector<StepTime> step_times(const std::vector<TraceEvent>& events, int gpu) {
  std::map<int, StepTime> by;
  for (const TraceEvent& e : events) {
    if (e.rank != gpu) continue;
    auto [it, fresh] = by.try_emplace(e.step, StepTime{e.step, e.start_s, e.end_s});
    if (!fresh) {
      it->second.start_s = std::min(it->second.start_s, e.start_s);
      it->second.end_s = std::max(it->second.end_s, e.end_s);
    }
  }
  std::vector<StepTime> out;
  for (const auto& [id, t] : by) out.push_back(t);
  return out;
}

double error_pct(double measured, double simulated) {
  return measured > 0 ? 100.0 * (simulated - measured) / measured : 0;
}

}  // namespace

Command add_validate(CLI::App& app) {
  auto f = std::make_shared<ValidateFlags>();
  CLI::App* sub = app.add_subcommand(
      "validate",
      "Run a few iterations of a training run (as `memwall run`) and simulate the same schedule on the\n"
      "same profile (as `memwall simulate`), then compare them step by step: iteration time measured\n"
      "(median after the first step) against simulated, the same per phase, busy time per resource,\n"
      "and the steps whose start times differ most. Use a profile of this machine (`memwall calibrate`).\n"
      "  memwall calibrate --nvme-dir /tmp -o my.yaml\n"
      "  memwall validate --profile my.yaml --config exec/data/run.yaml --strategy zero_inf_cpu\n"
      "  memwall validate --profile my.yaml --plan p.yaml --nvme-dir /tmp/swap --trace-dir traces/\n"
      "Under mpirun -np N it runs N data-parallel ranks, as `memwall run` does (calibrate under the same\n"
      "mpirun so the profile has the ranks' all-reduce bandwidth).");
  f->in.add(*sub, "Iterations to execute (default 8): the first is warm-up, the median of the others is compared");
  sub->add_option("--trace-dir", f->trace_dir,
                  "Write measured.json and simulated.json (Chrome traces of the last iteration) into this folder");
  add_int(*sub, "--top", f->top, 0, 1000, "How many of the most-differing steps to list (default 10)");
  sub->add_flag("--json", f->json,
                "JSON Lines on stdout: one object per executed step as it completes (type step), then the\n"
                "comparison (type summary; the last line)");
  return {sub, [f, sub]() {
            if (!f->in.steps) f->in.steps = 8;
            if (*f->in.steps < 2) throw UsageError("--steps: expected at least 2 (one warm-up, one measured), got " +
                                                   std::to_string(*f->in.steps));
            if (!f->trace_dir.empty()) make_output_folder("--trace-dir", f->trace_dir);
            PreparedRun prep = prepare_run(f->in, *sub);
exec::EngineOptions& o = prep.options;
            o.trace = true;
            if (o.config.optimizer_overlap == OptimizerOverlap::dpu && prep.rc.steps <= o.config.dpu_warmup + 1)
              throw UsageError("--steps: with --optimizer-overlap dpu, more than the warm-up (" +
                               std::to_string(o.config.dpu_warmup) + ") + 1 steps, got " + std::to_string(prep.rc.steps));
            const exec::Corpus corpus = take(exec::Corpus::load(prep.rc.corpus));
            // Ranks are mpirun's processes, as for `memwall run`; rank 0 simulates and prints. A
            // rank that fails stops the job: the others would wait in a collective.
            exec::MpiWorld& world = exec::MpiWorld::get();
            const bool lead = world.rank() == 0;
            auto fail = [&world](const std::string& message) {
              if (world.size() > 1) world.abort("memwall validate: rank " + std::to_string(world.rank()) + ": " + message, 1);
              throw std::runtime_error(message);
            };
            // One plan, two consumers: the engine runs this rank's schedule as built and rank 0's
            // simulator replays that very object (with the broadcast variant, whose ranks differ,
            // beside the other ranks' schedules built the same way).
            Result<exec::RankPlan> plan = exec::plan_rank(o);
            if (!plan && world.size() > 1) fail(plan.error());
            Result<std::unique_ptr<exec::Engine>> created = exec::Engine::create(take(std::move(plan)));
            if (!created && world.size() > 1) fail(created.error());
            std::unique_ptr<exec::Engine> engine = take(std::move(created));
            const Schedule& executed = engine->schedule();
            const exec::EngineOptions& run = engine->plan().options;  // as the engine normalised them
            const TrainingConfig& c = executed.config;

            const bool show = !f->json && lead;
            if (show)
              std::cerr << "validate: executing " << prep.rc.steps << " iterations of " << executed.strategy << " ("
                        << executed.steps.size() << " steps each) ..." << std::endl;
            exec::TrainOptions to;
            to.last_step = prep.rc.steps;
            to.data_rng = exec::data_seed(prep.rc);  // the same data as run
            const int per_iter = engine->tokens_per_iteration() * engine->ranks();
            auto on_step = [&](int i, const exec::IterationReport& r) -> Result<bool> {
              if (f->json && lead) print_line(step_line(i, r, per_iter / r.iteration_s));  // as each completes
              return true;
            };
            Result<exec::TrainResult> trained = exec::train(*engine, corpus, prep.rc.seq, to, on_step);
            if (!trained) fail(trained.error());
            const exec::IterationReport& last = trained->last;
            // the measured side: every number the median of the steady steps (all but the first)
            const std::size_t from = steady_from(trained->iteration_s.size());
            const std::vector<double> steady(trained->iteration_s.begin() + long(from), trained->iteration_s.end());
            const double measured_s = median(steady);
            // how far apart the same iteration ran: an error inside that spread is the machine's, not the model's
            const auto [fastest, slowest] = std::minmax_element(steady.begin(), steady.end());
            const double spread_pct = measured_s > 0 ? 100 * (*slowest - *fastest) / measured_s : 0;
            if (!lead) return 0;
            // a busy machine: what was measured includes the others' share of the cores
            const adam::CpuLoad load = engine->stats().load;
            if (load.others >= adam::kBusyCores)
              std::cerr << "memwall validate: warning: while it ran, " << adam::describe_load(load)
                        << "; the measured times include their share of the cores (run it on a quiet machine)\n";
            if (show) std::cerr << "validate: simulating the same schedule ..." << std::endl;
            std::vector<Schedule> others;  // the broadcast variant's other ranks, a pipeline's other stages
            if (executed.broadcast)
              for (int r = 1; r < engine->ranks(); ++r) others.push_back(take(exec::rank_schedule(run, r)));
            for (int stage = 1; stage < c.pp; ++stage) others.push_back(take(exec::rank_schedule(run, 0, stage)));
            std::vector<const Schedule*> replayed = {&executed};
            for (const Schedule& x : others) replayed.push_back(&x);
            sim::SimOptions so;
            so.trace = true;
            sim::SimReport sr = take(sim::simulate(replayed, run.profile, so));
            if (sr.overflow) throw UsageError("validate: the simulator finds the schedule does not fit: " + sr.overflow->message);
            const OverlapReport mo =
                median_overlap(std::vector<OverlapReport>(trained->overlap.begin() + long(from), trained->overlap.end()));
            // the executed schedule is the first replayed, and simulate() numbers its GPU 0
            const std::vector<StepTime> sim_times = step_times(sr.trace, 0);
            const OverlapReport so_rep = overlap_report(executed, sim_times);

            // steps whose start times differ most (both relative to their iteration's start)
            std::map<int, StepTime> measured_at;
            for (const StepTime& t : last.times) measured_at[t.step] = t;
            struct Diff {
              int step;
              double measured, simulated;
            };
            std::vector<Diff> diffs;
            for (const StepTime& t : sim_times)
              if (auto it = measured_at.find(t.step); it != measured_at.end())
                diffs.push_back({t.step, it->second.start_s, t.start_s});
            std::sort(diffs.begin(), diffs.end(), [](const Diff& a, const Diff& b) {
              return std::abs(a.simulated - a.measured) > std::abs(b.simulated - b.measured);
            });
            if (diffs.size() > std::size_t(f->top)) diffs.resize(std::size_t(f->top));

            const std::string statistic = steady_statistic(1, prep.rc.steps);
            const double train_tokens = f->in.tokens.value();
            const Throughput tp_measured = run_throughput(*engine, o.profile, measured_s, train_tokens);
            const Throughput tp_simulated = run_throughput(*engine, o.profile, sr.iteration_s, train_tokens);
            const char* phase_names[4] = {"forward", "recompute", "backward", "optimizer"};
            nlohmann::ordered_json j = {{"type", "summary"},
                                        {"statistic", "measured: " + statistic + "; simulated: one iteration"},
                                        {"strategy", executed.strategy},
                                        {"profile", o.profile.name},
                                        {"dp", c.dp},
                                        {"mp", c.mp},
                                        {"pp", c.pp},
                                        {"steps", prep.rc.steps},
                                        {"schedule_steps", executed.steps.size()},
                                        {"host_threads", engine->stats().threads},
                                        {"other_processes_cores", load.others}};
            j["iteration_s"] = {{"measured", measured_s},
                                {"measured_last", last.iteration_s},
                                {"measured_min", *fastest},
                                {"measured_max", *slowest},
                                {"measured_spread_pct", spread_pct},
                                {"simulated", sr.iteration_s},
                                {"error_pct", error_pct(measured_s, sr.iteration_s)}};
            std::vector<std::vector<std::string>> rows = {{"", "measured", "simulated", "error"}};
            auto ms = [](double s) { return format_sig(s * 1e3, 3) + " ms"; };
            auto pct = [](double e) {
              std::ostringstream s;
              s << std::showpos << std::fixed << std::setprecision(1) << e << " %";
              return s.str();
            };
            rows.push_back({"iteration", ms(measured_s), ms(sr.iteration_s),
                            pct(error_pct(measured_s, sr.iteration_s))});
            j["throughput"] = {{"measured", throughput_json(tp_measured)}, {"simulated", throughput_json(tp_simulated)}};
            rows.push_back({"tokens/s", format_count(tp_measured.tokens_per_s), format_count(tp_simulated.tokens_per_s),
                            pct(error_pct(tp_measured.tokens_per_s, tp_simulated.tokens_per_s))});
            rows.push_back({"MFU", format_sig(100 * tp_measured.mfu) + " %", format_sig(100 * tp_simulated.mfu) + " %",
                            pct(error_pct(tp_measured.mfu, tp_simulated.mfu))});
            nlohmann::ordered_json phases = nlohmann::ordered_json::object();
            for (int p = 0; p < 4; ++p) {
              const double a = mo.phase_s[size_t(p)], b = so_rep.phase_s[size_t(p)];
              if (a == 0 && b == 0) continue;
              phases[phase_names[p]] = {{"measured", a}, {"simulated", b}};
              rows.push_back({std::string(phase_names[p]), ms(a), ms(b), pct(error_pct(a, b))});
            }
            j["phase_s"] = phases;
            nlohmann::ordered_json busy = {{"compute", {{"measured", mo.compute_s}, {"simulated", so_rep.compute_s}}}};
            rows.push_back({"busy: compute", ms(mo.compute_s), ms(so_rep.compute_s),
                            pct(error_pct(mo.compute_s, so_rep.compute_s))});
            for (int l = 1; l < kLinkClasses; ++l) {
              const double a = mo.transfer_s[size_t(l)], b = so_rep.transfer_s[size_t(l)];
              if (a == 0 && b == 0) continue;
              const std::string name = to_string(LinkClass(l));
              busy[name] = {{"measured", a}, {"simulated", b},
                            {"exposed_measured", mo.exposed_s[size_t(l)]}, {"exposed_simulated", so_rep.exposed_s[size_t(l)]}};
              rows.push_back({"busy: " + name, ms(a), ms(b), pct(error_pct(a, b))});
            }
            j["busy_s"] = busy;
            nlohmann::ordered_json dj = nlohmann::ordered_json::array();
            std::vector<std::vector<std::string>> drows = {{"step", "", "measured start", "simulated start", "difference"}};
            for (const Diff& d : diffs) {
              const std::string label = step_label(executed.steps[size_t(d.step)]);
              dj.push_back({{"step", d.step}, {"label", label}, {"measured_start_s", d.measured},
                            {"simulated_start_s", d.simulated}});
              drows.push_back({std::to_string(d.step), label, ms(d.measured), ms(d.simulated), ms(d.simulated - d.measured)});
            }
            j["most_different_steps"] = dj;
            if (!f->trace_dir.empty()) {
              const std::string a = (std::filesystem::path(f->trace_dir) / "measured.json").string();
              const std::string b = (std::filesystem::path(f->trace_dir) / "simulated.json").string();
              write_output(a, chrome_trace_json(engine->trace_events(last), "memwall run (" + executed.strategy + ")", kExecutedTracePid));
              write_output(b, sim::chrome_trace_json(sr));
              j["traces"] = {a, b};
            }
            if (f->json) {
              print_line(j);
              return 0;
            }
            std::cout << "memwall validate: GPT " << o.model.layers << " layers, hidden " << o.model.hidden << ", "
                      << o.model.heads << " heads, bsz " << format_g(c.bsz) << " x seq " << c.seq << ", ci " << c.ci
                      << ", tiling " << c.tiling_factor << "; " << executed.strategy << " on " << o.profile.name
                      << ", " << layout_words(c.dp, c.mp, c.pp) << " ("
                      << executed.steps.size() << " schedule steps, " << prep.rc.steps << " iterations executed)\n"
                      << "measured: " << statistic << " (they ran " << format_sig(*fastest * 1e3, 3) << "-"
                      << format_sig(*slowest * 1e3, 3) << " ms, " << format_sig(spread_pct, 2)
                      << " % apart); simulated: one iteration replayed\n"
                      << render_table(rows);
            if (engine->backend_caps().name == "cpu")
              std::cout << kCpuBusyCaveat;
            if (!diffs.empty())
              std::cout << "steps whose start times differ most (from each iteration's start):\n" << render_table(drows);
            if (!f->trace_dir.empty())
              std::cout << "traces: " << j["traces"][0].get<std::string>() << ", " << j["traces"][1].get<std::string>()
                        << " (open both in Perfetto)\n";
            return 0;
          }};
}

}  // namespace memwall::cli
