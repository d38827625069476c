// `memwall run`: trains a GPT with exec/engine, executing the schedule `memwall simulate` replays
// for the same strategy flags or plan, and prints losses, the per-tier traffic next to the
// schedule's, the overlap of transfers with compute and peak memory per tier. Parses and prints;
// exec/engine runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "cli/run_setup.hpp"
#include "exec/adam/cpu_adam.hpp"
#include "exec/engine/collectives.hpp"
#include "exec/engine/engine.hpp"
#include "exec/engine/run_config.hpp"
#include "exec/engine/training.hpp"
#include "exec/io/user_files.hpp"
#include "model/units.hpp"

namespace memwall::cli {
namespace {

struct RunFlags {
  RunInputs in;
  std::string trace;
  std::string save, resume;
  std::optional<int> save_every;  // at the end only when not given
  bool json = false;
  bool serial = false;
  bool verify = false;
  double stall_timeout_s = 120;
  int threads = 0;
};

// "host threads 1 (fitted: other processes kept 1.9 of 2 cores busy: stress-ng-cpu (pid 812) 1.0, ...)"
std::string threads_line(const exec::EngineStats& st) {
  std::string line = "host threads " + std::to_string(st.threads);
  if (st.threads_fitted) line += " (fitted: " + adam::describe_load(st.load) + ")";
  else line += " (--threads)";
  return line;
}

std::string progress_bar(int step, int steps) {
  const int width = 20, filled = int(std::lround(double(width) * step / steps));
  return "[" + std::string(std::size_t(filled), '#') + std::string(std::size_t(width - filled), '.') + "] " +
         std::to_string(100 * step / steps) + " %";
}

}  // namespace

Command add_run(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* sub = app.add_subcommand(
      "run",
      "Train a GPT (byte-level, on the corpus memwall ships) by executing the ZeRO-Infinity schedule that\n"
      "`memwall simulate` replays: parameters, gradients and optimizer states on gpu (the backend's device\n"
      "memory), cpu (pinned host memory) or nvme (swap files through io_uring, O_DIRECT), prefetched as the\n"
      "schedule says. Prints loss per step, then bytes moved per link class against the schedule, transfer\n"
      "time hidden behind compute and peak bytes per tier.\n"
      "Tensor slicing (--mp N, Megatron-LM's: heads and feed-forward split, two all-reduces per block each\n"
      "way, the embedding whole on every slice) runs over mpirun -np dp x mp ranks, consecutive ranks one mp\n"
      "group. Pipeline stages (--pp N, 1F1B over --grad-accum micro-steps; a tied embedding's two copies\n"
      "summed after the stages' backward) run over mpirun -np dp x mp x pp ranks, the stages last.\n"
      "Planned and simulated but not executed, so refused with the reason: 1-bit Adam (--onebit-adam) and\n"
      "block-sparse attention (--attention-density).\n"
      "The executor trains the paper's GPT block and today's dense kinds: grouped-query attention (kv_heads,\n"
      "head_dim), SwiGLU / GeGLU feed-forward (ffn, intermediate), RMSNorm, rotary positions (rope_theta),\n"
      "untied LM head, linear layers without biases (a Llama block), from a plan's model or the run config's\n"
      "fields. A mixture of experts (no router or expert dispatch in the executor) and sliding-window attention\n"
      "are refused with the reason, though plan and simulate handle them.\n"
      "  memwall run --config exec/data/run.yaml --strategy zero_inf_nvme --nvme-dir /tmp/swap\n"
      "  memwall plan --profile local-cpu --layers 8 --hidden 512 --heads 8 --seq 64 --vocab 256 -o p.yaml\n"
      "  memwall run --plan p.yaml --nvme-dir /tmp/swap");
  f->in.add(*sub, "Training steps in all (default: the run config's, 300); with --resume, the run goes on from the\n"
                  "checkpoint's step to this one");
  sub->add_option("--save", f->save,
                  "Checkpoint folder: every rank writes its 16-bit parameters and fp32 optimizer states from\n"
                  "wherever they live, rank 0 a manifest last (DIR/step-N/, DIR/latest; the newest two are kept)");
  add_int(*sub, "--save-every", f->save_every, 1, 1000000000, "Checkpoint every K steps (with --save; default: at the end only)");
  sub->add_option("--resume", f->resume, "Continue from the latest checkpoint in this folder (same model, placement, dp)");
  sub->add_option("--trace", f->trace,
                  "Write a Chrome trace of the last step (open in Perfetto beside `memwall simulate --trace`)");
  sub->add_flag("--json", f->json,
                "JSON Lines on stdout: one object per step as it completes (type step: loss, lr, iteration_s,\n"
                "tokens_per_s, compute_s, hidden_fraction), then one summary (type summary: every step again,\n"
                "medians, traffic and achieved bytes/s per link class, overlap, peak bytes); the last line alone\n"
                "is the whole run");
  sub->add_flag("--serial", f->serial, "Debug: run one step of the schedule at a time (same results, no overlap)");
  add_number(*sub, "--stall-timeout", f->stall_timeout_s, 86400,
             "Seconds with no progress anywhere (no step, I/O block or host-lane piece completed, on any rank\n"
             "of the node) before the run is declared stuck and names what it waited on (default 120; a step\n"
             "expected to take longer on the profile gets 20 times its expected time)");
  add_int(*sub, "--threads", f->threads, 0, 4096,
          "Host threads of the CPU kernels (OpenMP, OpenBLAS) and CPU Adam (default 0: the cores other\n"
          "processes leave free, looked at when the run starts and again as it goes; a thread more than there\n"
          "are free cores only waits for one). Losses do not depend on it");
  sub->add_flag("--verify", f->verify,
                "Check every NVMe read against a checksum taken when the block was written (swap files); a\n"
                "mismatch stops the run with the file and offset (exit 1)");
  return {sub, [f, sub]() {
            PreparedRun prep = prepare_run(f->in, *sub);
            exec::RunConfig& rc = prep.rc;
            exec::EngineOptions& o = prep.options;
            const HardwareProfile& profile = o.profile;
            o.trace = !f->trace.empty() || f->json;
            o.serial = f->serial;
            o.stall_timeout_s = f->stall_timeout_s;
            o.threads = f->threads;
            o.io.verify = f->verify;
            if (const char* pause = std::getenv("MEMWALL_SAVE_PAUSE_S")) o.save_pause_s = std::atof(pause);  // tests
            if (f->save_every && f->save.empty()) throw UsageError("--save-every: give --save DIR too");
            // dpu: after the warm-up, a step ends with its gradients pending (the next step applies
            // them); a checkpoint does not hold them, so it would lose a step's update.
            if (!f->save.empty() && o.config.optimizer_overlap == OptimizerOverlap::dpu) {
              if (rc.steps > o.config.dpu_warmup)
                throw UsageError("--save: with --optimizer-overlap dpu, checkpoints after the warm-up (--dpu-warmup " +
                                 std::to_string(o.config.dpu_warmup) + ") would lose the pending step's gradients; "
                                 "save with --optimizer-overlap backward or none (exact), or within the warm-up (--steps <= " +
                                 std::to_string(o.config.dpu_warmup) + ")");
            }
            const exec::Corpus corpus = take(exec::Corpus::load(rc.corpus));
            // Ranks are mpirun's processes. A rank that fails stops the whole job (MPI_Abort) with
            // its rank in the message: the others would wait for it in a collective forever.
            exec::MpiWorld& world = exec::MpiWorld::get();
            auto fail = [&world](const std::string& message, int code) -> int {
              if (world.size() > 1) world.abort("memwall run: rank " + std::to_string(world.rank()) + ": " + message, code);
              std::cerr << "memwall run: " << message << "\n";
              return code;
            };
            // Destinations before any work (a run must not train for hours, then fail to save), and
            // the checkpoint folder this run's alone while it lives (one lock per rank).
            if (world.rank() == 0) check_output_file("--trace", f->trace);
            std::optional<io::FolderLock> save_lock;
            if (!f->save.empty()) {
              make_output_folder("--save", f->save);
              Result<io::FolderLock> lock = io::FolderLock::acquire(f->save, world.rank(), "--save");
              if (!lock) {
                if (world.size() > 1) return fail(lock.error(), 2);
                throw UsageError(lock.error());
              }
              save_lock = std::move(lock).value();
            }
            Result<std::unique_ptr<exec::Engine>> created = exec::Engine::create(o);
            if (!created) {
              if (world.size() > 1) return fail(created.error(), 2);
              throw UsageError(created.error());
            }
            std::unique_ptr<exec::Engine> engine = std::move(created).value();
            const bool lead = world.rank() == 0;  // rank 0 prints; every rank computes
            const Schedule& s = engine->schedule();
            std::ostringstream quiet;
            std::ostream& out = !lead ? quiet : f->json ? std::cerr : std::cout;
            const int every = rc.steps > 50 ? std::max(1, rc.steps / 25) : 1;
            exec::TrainOptions to;
            to.last_step = rc.steps;
            to.data_rng = exec::data_seed(rc);
            to.save_dir = f->save;
            to.save_every = f->save_every.value_or(0);
            // A checkpoint that does not load is refused before the header: nothing on stdout then.
            if (!f->resume.empty()) {
              Result<exec::RunPosition> at = engine->resume(f->resume);
              if (!at) {
                if (world.size() > 1) return fail(at.error(), 2);
                throw UsageError(at.error());
              }
              to.data_rng = at->data_rng;
              to.first_step = at->iteration + 1;
              if (to.first_step > rc.steps)
                throw UsageError("--steps " + std::to_string(rc.steps) + ": the checkpoint in " + f->resume +
                                 " is at step " + std::to_string(at->iteration) + " already (ask for more steps)");
            }
            const bool show = !f->json;
            if (show) {
              const std::string kind = exec::gpt_model_spec(rc.model).kind_words();
              out << "memwall run: " << (kind.empty() ? "GPT " : "") << rc.model.layers << " layers, hidden " << rc.model.hidden << ", "
                  << rc.model.heads << " heads, " << (kind.empty() ? "" : kind + ", ") << format_count(double(engine->num_params())) << " params; bsz "
                  << o.config.bsz << " x seq " << rc.seq << ", ci " << o.config.ci << ", tiling "
                  << o.config.tiling_factor << ", " << std::string(adam::dtype_name(o.precision)) << " parameters, lr " << rc.lr
                  << (o.lr_schedule.decay != adam::LrDecay::constant || o.lr_schedule.warmup_steps > 0
                          ? " (" + adam::describe(o.lr_schedule) + ")"
                          : "")
                  << (o.config.grad_clip > 0 ? ", gradients clipped at norm " + format_g(o.config.grad_clip) : "")
                  << ", seed " << rc.seed << "\n  strategy " << s.strategy << " on " << profile.name << ", "
                  << layout_words(engine->ranks(), s.config.mp, s.config.pp, s.config.virtual_stages)
                  << (s.grad_accum > 1 ? ", grad-accum " + std::to_string(s.grad_accum) : "")
                  << (engine->ranks() * s.config.mp * s.config.pp > 1 ? " (mpirun ranks, " : " (") << "global batch "
                  << engine->micro_batches_per_iteration() * o.config.bsz * engine->ranks() << "): backend "
                  << engine->backend_caps().name << " (" << engine->backend_caps().device << ", capacity "
                  << format_bytes(double(engine->backend_caps().capacity_bytes)) << "); schedule of " << s.steps.size()
                  << " steps, peak gpu " << format_bytes(s.peak_bytes[0]) << ", cpu " << format_bytes(s.peak_bytes[1])
                  << ", nvme " << format_bytes(s.peak_bytes[2]) << "\n  " << threads_line(engine->stats())
                  << "\n\n   step      loss   tokens/s   step ms  hidden" << (o.config.grad_clip > 0 ? "  grad norm" : "")
                  << "\n";
            }
            if (!f->resume.empty()) out << "resumed from " << f->resume << " at step " << to.first_step - 1 << "\n";
            nlohmann::ordered_json steps_json = nlohmann::ordered_json::array();
            const int per_iter = engine->tokens_per_iteration();
            auto on_step = [&](int i, const exec::IterationReport& r) -> Result<bool> {
              const double tokens_per_s = per_iter * engine->ranks() / r.iteration_s;
              nlohmann::ordered_json line = step_line(i, r, tokens_per_s);
              if (f->json && lead) print_line(line);  // as it completes: a long run is followed, not waited for
              line.erase("type");
              steps_json.push_back(std::move(line));
              if (!show || !(i == to.first_step || i % every == 0 || i == rc.steps)) return true;
              double moved_s = 0;
              for (double t : r.overlap.transfer_s) moved_s += t;
              out << std::setw(7) << i << std::setw(10) << std::fixed << std::setprecision(4) << r.loss << std::setw(11)
                  << std::setprecision(0) << tokens_per_s << std::setw(10)
                  << std::setprecision(1) << r.iteration_s * 1e3;
              if (moved_s > 0) out << std::setw(7) << std::setprecision(0) << 100 * r.overlap.hidden_fraction << " %";
              else out << "      -";
              if (std::isfinite(r.grad_norm))  // * where it was clipped
                out << std::setw(10) << std::setprecision(3) << r.grad_norm << (r.grad_norm > o.config.grad_clip ? "*" : " ");
              if (rc.steps > 50) out << "  " << progress_bar(i, rc.steps);
              out << std::endl;
              return true;
            };
            Result<exec::TrainResult> trained = exec::train(*engine, corpus, rc.seq, to, on_step);
            if (!trained) return fail(trained.error(), 1);
            const exec::IterationReport& last = trained->last;
            const std::vector<double>& iter_s = trained->iteration_s;
            const float first = trained->first_loss;
            const int first_step = to.first_step;
            out << std::defaultfloat << std::setprecision(6);
            const exec::EngineStats st = engine->stats();
            // One statistic for every time in the summary: the median of the steady steps (all but
            // the first when there are more than two); bytes are the same in every step.
            const std::size_t from = steady_from(iter_s.size());
            const double med = median(std::vector<double>(iter_s.begin() + long(from), iter_s.end()));
            const OverlapReport mo =
                median_overlap(std::vector<OverlapReport>(trained->overlap.begin() + long(from), trained->overlap.end()));
            const std::string statistic = steady_statistic(first_step, rc.steps);
            const Throughput tp = run_throughput(*engine, profile, med, f->in.tokens.value());
            nlohmann::ordered_json links = nlohmann::ordered_json::object();
            std::vector<std::vector<std::string>> link_rows = {
                {"link", "moved", "schedule", "busy", "achieved", "exposed"}};
            for (int c = 1; c < kLinkClasses; ++c) {
              if (s.traffic_bytes[size_t(c)] == 0 && last.bytes_moved[size_t(c)] == 0) continue;
              const char* name = to_string(LinkClass(c));
              const double moved = last.bytes_moved[size_t(c)], busy = mo.transfer_s[size_t(c)];
              const double achieved = busy > 0 ? moved / busy : 0;  // while the link class was busy
              links[name] = {{"moved_bytes", moved},
                             {"schedule_bytes", s.traffic_bytes[size_t(c)]},
                             {"transfer_s", busy},
                             {"achieved_Bps", achieved},
                             {"exposed_s", mo.exposed_s[size_t(c)]}};
              link_rows.push_back({name, format_bytes(moved), format_bytes(s.traffic_bytes[size_t(c)]),
                                   format_sig(busy * 1e3, 3) + " ms",
                                   achieved > 0 ? format_sig(achieved / 1e9, 3) + " GB/s" : "-",
                                   format_sig(mo.exposed_s[size_t(c)] * 1e3, 3) + " ms"});
            }
            nlohmann::ordered_json peak = nlohmann::ordered_json::object();
            std::vector<std::vector<std::string>> tier_rows = {{"tier", "held", "memory plan", "schedule peak"}};
            for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) {
              double planned = double(s.arena_bytes[int(t)]);
              for (double b : s.persistent_bytes[int(t)]) planned += b;
              peak[to_string(t)] = {{"held_bytes", last.held_bytes[int(t)]}, {"live_bytes", last.live_bytes[int(t)]},
                                    {"plan_bytes", planned}, {"schedule_bytes", s.peak_bytes[int(t)]}};
              tier_rows.push_back({to_string(t), format_bytes(last.held_bytes[int(t)]), format_bytes(planned),
                                   format_bytes(s.peak_bytes[int(t)])});
            }
            // every rank's bytes per link class against its own schedule (a collective: all ranks)
            Result<std::vector<exec::RankTraffic>> by_rank = engine->traffic_by_rank(last);
            if (!by_rank) return fail(by_rank.error(), 1);
            nlohmann::ordered_json ranks_json = nlohmann::ordered_json::array();
            std::vector<std::vector<std::string>> rank_rows = {{"rank", "link", "moved", "schedule"}};
            for (std::size_t q = 0; q < by_rank->size(); ++q) {
              nlohmann::ordered_json rj = nlohmann::ordered_json::object();
              for (int c = 1; c < kLinkClasses; ++c) {
                const double mv = (*by_rank)[q].moved_bytes[size_t(c)], sc = (*by_rank)[q].schedule_bytes[size_t(c)];
                if (mv == 0 && sc == 0) continue;
                rj[to_string(LinkClass(c))] = {{"moved_bytes", mv}, {"schedule_bytes", sc}};
                rank_rows.push_back({std::to_string(q), to_string(LinkClass(c)), format_bytes(mv), format_bytes(sc)});
              }
              ranks_json.push_back(rj);
            }
            if (show) {
              out << "\nloss " << first << " -> " << last.loss << " over " << rc.steps - first_step + 1 << " steps; "
                  << statistic << ": iteration " << format_sig(med * 1e3, 3) << " ms, compute "
                  << format_sig(mo.compute_s * 1e3, 3) << " ms, ";
              if (link_rows.size() > 1)
                out << format_sig(100 * mo.hidden_fraction, 3) << " % of transfer time hidden behind compute\n"
                    << "per link class (bytes per step; busy: while any transfer on it ran; achieved = moved / busy):\n"
                    << render_table(link_rows) << (engine->backend_caps().name == "cpu" ? kCpuBusyCaveat : "");
              else
                out << "no transfers (every state on the device)\n";
              out << throughput_words(tp) << "\n";
              out << render_table(tier_rows);
              if (engine->ranks() > 1) out << "per rank (each against its own schedule):\n" << render_table(rank_rows);
              out << "device memory used " << format_bytes(double(st.device_extent_bytes)) << " of "
                  << format_bytes(double(st.device_capacity_bytes));
              if (st.swap_file_bytes > 0)
                out << "; io engine read " << format_bytes(double(st.io.bytes_read)) << ", wrote "
                    << format_bytes(double(st.io.bytes_written)) << " in all (4 KiB blocks)"
                    << (f->verify ? ", every block read verified against its write" : "");
              out << "\n";
            }
            if (f->json) {
              nlohmann::ordered_json j = {
                  {"type", "summary"},
                  {"statistic", statistic},
                  {"strategy", s.strategy},
                  {"profile", profile.name},
                  {"backend", engine->backend_caps().name},
                  {"precision", std::string(adam::dtype_name(o.precision))},
                  {"params", engine->num_params()},
                  {"steps", steps_json},
                  {"iteration_s_median", med},
                  {"compute_s", mo.compute_s},
                  {"phase_s", {{"forward", mo.phase_s[int(Phase::forward)]},
                               {"recompute", mo.phase_s[int(Phase::recompute)]},
                               {"backward", mo.phase_s[int(Phase::backward)]},
                               {"optimizer", mo.phase_s[int(Phase::optimizer)]}}},
                  {"hidden_fraction", mo.hidden_fraction},
                  {"throughput", throughput_json(tp)},
                  {"links", links},
                  {"peak_bytes", peak},
                  {"device_high_water_bytes", st.device_high_water_bytes},
                  {"device_extent_bytes", st.device_extent_bytes},
                  {"device_reserved_bytes", st.device_reserved_bytes},
                  {"device_capacity_bytes", st.device_capacity_bytes},
                  {"io_bytes_read", st.io.bytes_read},
                  {"io_bytes_written", st.io.bytes_written},
                  {"io_bytes_verified", st.io.bytes_verified},
                  {"threads", st.threads},
                  {"threads_fitted", st.threads_fitted},
                  {"other_processes_cores", st.load.others},
                  {"dp", engine->ranks()},
                  {"mp", s.config.mp},
                  {"pp", s.config.pp},
                  {"virtual_stages", s.config.pp > 1 ? std::max(1, s.config.virtual_stages) : 1},
                  {"grad_accum", std::max(1, s.grad_accum)},
                  {"grad_clip", o.config.grad_clip},
                  {"global_batch", engine->micro_batches_per_iteration() * o.config.bsz * engine->ranks()},
                  {"ranks", ranks_json}};
              if (lead) print_line(j);
            }
            if (!f->trace.empty() && lead)
              write_output(f->trace, chrome_trace_json(engine->trace_events(last), "memwall run (" + s.strategy + ")", kExecutedTracePid));
            return 0;
          }};
}

}  // namespace memwall::cli
