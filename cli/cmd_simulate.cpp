// `memwall simulate`: one training iteration replayed on a SimGrid platform built from the
// profile. Parses flags and prints; sim/ does the work.
#include <chrono>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "exec/engine/engine.hpp"
#include "model/units.hpp"
#include "planner/plan_file.hpp"
#include "sim/replay.hpp"

namespace memwall::cli {
namespace {

struct SimulateFlags {
  ProfileFlags profile;
  ModelFlags model;
  StrategyFlags run;
  std::string plan;
  bool no_overlap = false;
  bool full = false;
  std::string trace;
  bool json = false;
  TokensFlag tokens;
};

}  // namespace

Command add_simulate(CLI::App& app) {
  auto f = std::make_shared<SimulateFlags>();
  CLI::App* sub = app.add_subcommand(
      "simulate",
      "Replay one training iteration on a SimGrid model of the profile (GPUs, PCIe, NVLink/NVSwitch,\n"
      "NVMe, InfiniBand) and report iteration time, TFLOPS per GPU, efficiency, busy time per resource.");
  f->profile.add(*sub);
  f->model.add(*sub);
  f->run.add(*sub);
  sub->add_option("--plan", f->plan, "A plan file from `memwall plan -o` instead of --model and the training flags");
  sub->add_flag("--no-overlap", f->no_overlap, "Run every step of a rank after the previous one (no prefetch overlap)");
  sub->add_flag("--full", f->full,
                "Replay every GPU, not one GPU (one per pipeline stage) with its share of the node (the symmetric\n"
                "shortcut's ground truth; slow: a replay past 2 s says how far it got on stderr every 5 s;\n"
                "at most 256 GPUs)");
  sub->add_option("--trace", f->trace, "Write a Chrome trace (open in Perfetto) to this file");
  f->tokens.add(*sub);
  sub->add_flag("--json", f->json,
                "JSON output: iteration_s, tflops_per_gpu, efficiency, busy_fraction, peak_bytes and the throughput\n"
                "(tokens_per_s, mfu, hfu, train_s: results/METRICS.md)");
  return {sub, [f, sub]() {
            check_output_file("--trace", f->trace);
            const double train_tokens = f->tokens.value();
            HardwareProfile p;
            ModelSpec m;
            Placement pl;
            TrainingConfig c;
            if (!f->plan.empty()) {
              if (f->model.given()) throw UsageError("--plan: give --plan or --model, not both");
              f->run.refuse_with_plan(*sub);
              for (const char* flag : {"--seq", "--vocab"})
                if (sub->count(flag) > 0)
                  throw UsageError(std::string(flag) + ": not used with --plan (the plan fixes the model)");
              // The plan names its profile and nodes; --profile/--nodes override them.
              Result<planner::Plan> peek = planner::load_plan(f->plan);
              if (!peek) throw UsageError(peek.error());
              ProfileFlags pf = f->profile;
              if (sub->count("--profile") == 0) pf.profile = peek->profile;
              if (sub->count("--nodes") == 0) pf.nodes = peek->nodes;
              p = pf.load();
              planner::Plan plan = take(planner::load_plan(f->plan, &p));
              m = plan.model;
              pl = plan.candidate.placement;
              c = take(fit_to_profile(take(validate(plan.candidate.config, m.layers)), p));
              c = take(check_schedule_size(m, pl, c, p));
            } else {
              p = f->profile.load();
              if (!f->model.given()) throw UsageError("--model: missing (or give --layers, --hidden and --heads, or --plan)");
              m = f->model.load();
              pl = f->run.placement();
              c = f->run.training(m, pl, p);
            }
            sim::SimOptions o;
            o.overlap = !f->no_overlap;
            o.trace = !f->trace.empty();
            o.full = f->full;
            o.sizes = take(exec::schedule_sizes(p, m, pl, c));  // the executor's buffers where `memwall run` runs p
            // A long replay (--full on many nodes, a huge model) says how far it got, on stderr
            // (stdout stays the report): after 2 s, then every 5 s.
            const auto began = std::chrono::steady_clock::now();
            const bool many = f->full && p.total_gpus() > p.gpus_per_node;
            double said_s = -3, first_s = -1, first_done = 0;  // the first report: the replay's own pace from there
            o.progress = [began, many, said_s, first_s, first_done](std::size_t done, std::size_t total,
                                                                    double simulated_s) mutable {
              if (total == 0) {  // every check passed; the replay is being built
                if (many) std::cerr << "memwall simulate: building the replay of every GPU (--full; slow on many nodes)" << std::endl;
                return;
              }
              const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
              if (first_s < 0) first_s = wall, first_done = double(done);
              if (wall < 2 || wall - said_s < 5) return;
              said_s = wall;
              std::cerr << "memwall simulate: replaying, " << format_sig(100.0 * double(done) / double(total), 2)
                        << " % of " << format_count(double(total)) << " activities done, "
                        << format_sig(simulated_s, 3) << " s of the iteration simulated (" << format_sig(wall, 2)
                        << " s";
              if (double(done) > first_done && wall > first_s)
                std::cerr << ", about "
                          << format_sig((wall - first_s) / (double(done) - first_done) * double(total - done), 2)
                          << " s left";
              std::cerr << ")" << std::endl;
            };
            sim::SimReport r = take(sim::simulate(m, pl, c, p, o));
            nlohmann::ordered_json j = {{"model", m.name}, {"profile", p.name}, {"nodes", p.nodes}, {"fits", !r.overflow}};
            j.update(sim::to_json(r));
            std::ostringstream o_text;
            if (r.overflow) {
              o_text << "does not fit: " << r.overflow->message << "\n";
            } else {
              const std::string gpus = r.gpus == p.total_gpus() && p.nodes == 1
                                           ? std::to_string(r.gpus) + " GPUs"
                                           : std::to_string(r.gpus) + " of " + std::to_string(p.total_gpus()) +
                                                 " GPUs on " + std::to_string(p.nodes) + " node(s)";
              o_text << "memwall simulate: " << m.name << " on " << p.name << " (" << gpus << ": dp " << r.dp
                     << " x mp " << r.mp << (r.pp > 1 ? " x pp " + std::to_string(r.pp) : std::string())
                     << (r.virtual_stages > 1 ? " interleaved x" + std::to_string(r.virtual_stages) : std::string())
                     << "), strategy " << r.strategy << ", bsz " << format_g(c.bsz) << ", ci "
                     << c.ci
                     << (c.grad_accum > 1 ? ", grad-accum " + std::to_string(c.grad_accum) + " (global batch " +
                                                format_g(c.bsz * c.grad_accum * r.dp) + ")"
                                          : std::string())
                     << (o.overlap ? "" : ", no overlap")
                     << (r.full ? ", every GPU replayed"
                                : r.pp > 1 ? ", one GPU per stage replayed" : "") << "\n";
              o_text << "iteration " << format_sig(r.iteration_s, 4) << " s, " << format_sig(r.tflops_per_gpu, 3)
                     << " TFLOPS per GPU, " << format_sig(100 * r.efficiency, 3) << " % of the achievable "
                     << format_flops_rate(r.peak_flops_per_s) << "\n";
              const Throughput tp = throughput(m, c, p, r.iteration_s, r.tflops_per_gpu * 1e12 * r.iteration_s, train_tokens);
              j.update(throughput_json(tp));
              o_text << throughput_words(tp) << "\n";
              std::vector<std::vector<std::string>> rows = {{"resource", "busy"}};
              for (const auto& [k, v] : r.busy_fraction) rows.push_back({k, format_sig(100 * v, 3) + " %"});
              o_text << render_table(rows);
            }
            std::vector<std::vector<std::string>> rows = {{"tier", "peak bytes per rank"}};
            for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme})
              rows.push_back({to_string(t), format_bytes(r.peak_bytes[int(t)])});
            o_text << render_table(rows);
            if (!f->trace.empty() && !r.overflow) write_output(f->trace, sim::chrome_trace_json(r));
            write_output("", f->json ? j.dump(2) + "\n" : o_text.str());
            return r.overflow ? 1 : 0;
          }};
}

}  // namespace memwall::cli
