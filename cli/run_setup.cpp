#include "cli/run_setup.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "exec/gpt/gpt.hpp"
#include "model/timeline.hpp"
#include "model/units.hpp"
#include "planner/plan_file.hpp"

namespace memwall::cli {
namespace {

// The model of a plan must be the model of the run config, field by field.
void check_same_model(const exec::RunConfig& rc, const std::string& config, const ModelSpec& m,
                      const std::string& plan) {
  auto differ = [&](const char* field, long run, long planned) {
    if (run != planned)
      throw UsageError(config + ": " + field + ": " + std::to_string(run) + ", but the plan " + plan + " has " +
                       std::to_string(planned) + " (give one of them, or make them agree)");
  };
  differ("layers", rc.model.layers, m.layers);
  differ("hidden", rc.model.hidden, m.hidden);
  differ("heads", rc.model.heads, m.heads);
  differ("seq", rc.seq, m.seq);
  const std::string run_kind = exec::gpt_model_spec(rc.model).kind_words(), planned = m.kind_words();
  if (run_kind != planned)
    throw UsageError(config + ": the block's kind is \"" + (run_kind.empty() ? "the paper's GPT" : run_kind) +
                     "\", but the plan " + plan + " has \"" + (planned.empty() ? "the paper's GPT" : planned) +
                     "\" (give one of them, or make them agree)");
}

}  // namespace

RunInputs::RunInputs() {
  run.strategy = "data_parallel";
  profile.profile = "local-cpu";
}

void RunInputs::add(CLI::App& sub, const std::string& steps_help) {
  sub.add_option("--config", config,
                 "Run YAML: layers, hidden, heads, steps, bsz, seq, ci, lr, weight_decay, grad_clip, seed, backend (cpu, cuda),\n"
                 "compute, precision (bf16, fp16, fp32), capacity (device memory, e.g. 48 MiB; default: the\n"
                 "profile's GPU memory), corpus (default: the one memwall ships, built in)");
  sub.add_option("--plan", plan,
                 "A plan from `memwall plan -o`: model, placement, batch, checkpoint interval, tiling and the\n"
                 "profile it was made for (instead of --config's model and the strategy flags)");
  profile.add(sub);
  profile.add_gpus(sub);
  run.add(sub);
  // What the run config gives, the flags override: their defaults are the config's.
  sub.get_option("--bsz")->description("Micro-batch per GPU (default: the run config's bsz)")->default_str("");
  sub.get_option("--ci")
      ->description("Transformer blocks between activation checkpoints (default: the run config's ci; 0 or absent\n"
                    "there: one checkpoint for the whole stack, ci = layers)")
      ->default_str("");
  // Planned and simulated, not executed: refused with the reason when given, so not offered here
  // (the subcommand's description names them).
  for (const char* hidden : {"--ep", "--onebit-adam", "--onebit-adam-warmup", "--attention-density"})
    sub.get_option(hidden)->group("");
  sub.add_option("--nvme-dir", nvme_dir, "Folder for the swap files of states placed on nvme (checked for room)");
  add_int(sub, "--steps", steps, 1, 1000000000, steps_help);
  tokens.add(sub);
}

PreparedRun prepare_run(const RunInputs& in, const CLI::App& sub) {
  if (in.config.empty() && in.plan.empty()) throw UsageError("--config: missing (or give --plan)");
  (void)in.tokens.value();  // a bad --tokens is refused before anything runs
  exec::RunConfig rc;
  if (!in.config.empty()) rc = take(exec::load_run_config(in.config));
  if (in.steps) rc.steps = *in.steps;
  exec::EngineOptions o;
  HardwareProfile profile;
  if (!in.plan.empty()) {
    in.run.refuse_with_plan(sub);
    Result<planner::Plan> peek = planner::load_plan(in.plan);
    if (!peek) throw UsageError(peek.error());
    ProfileFlags pf = in.profile;
    if (sub.count("--profile") == 0) pf.profile = peek->profile;
    if (sub.count("--nodes") == 0) pf.nodes = peek->nodes;
    if (sub.count("--gpus") == 0 && peek->gpus > 0) pf.gpus = peek->gpus / std::max(1, peek->nodes);
    profile = pf.load();
    planner::Plan plan = take(planner::load_plan(in.plan, &profile));
    if (Result<bool> ok = exec::executor_trains(plan.model); !ok) throw UsageError(in.plan + ": model." + ok.error());
    if (plan.model.vocab < 256)
      throw UsageError(in.plan + ": model.vocab: the executor trains a byte-level GPT, which needs 256 tokens, "
                       "got " + std::to_string(plan.model.vocab));
    if (!in.config.empty()) check_same_model(rc, in.config, plan.model, in.plan);
    const double theta = rc.model.rope_theta;  // the run config's (not a plan's field)
    rc.model = exec::gpt_config(plan.model);
    rc.model.rope_theta = theta;
    rc.seq = int(plan.model.seq);
    o.placement = plan.candidate.placement;
    o.config = plan.candidate.config;
    if (rc.grad_clip > 0 && o.config.grad_clip > 0 && rc.grad_clip != o.config.grad_clip)
      throw UsageError(in.config + ": grad_clip: " + format_g(rc.grad_clip) + ", but the plan " + in.plan + " has " +
                       format_g(o.config.grad_clip) + " (give one of them, or make them agree)");
    if (rc.grad_clip > 0 && o.config.grad_clip == 0) {  // the run config's, where the plan has none
      if (Result<bool> ok = check_optimizer_overlap(o.placement, o.config.optimizer_overlap, rc.grad_clip); !ok)
        throw UsageError(in.config + ": grad_clip: the plan " + in.plan + " runs the optimizer beside backward "
                         "(optimizer_overlap backward), which needs no global norm; plan again with --grad-clip");
      o.config.grad_clip = rc.grad_clip;
    }
    if (o.config.bsz != std::floor(o.config.bsz))
      throw UsageError(in.plan + ": bsz: the executor needs a whole micro-batch, got " + format_g(o.config.bsz));
    rc.bsz = int(o.config.bsz);
  } else {
    profile = in.profile.load();
    o.placement = in.run.placement();
    o.config = in.run.config;
    o.config.optimizer_overlap = take(parse_optimizer_overlap(in.run.overlap));
    if (sub.count("--bsz") == 0) o.config.bsz = rc.bsz;
    if (sub.count("--ci") == 0) o.config.ci = rc.ci == 0 ? rc.model.layers : rc.ci;
    if (sub.count("--grad-clip") == 0) o.config.grad_clip = rc.grad_clip;
    o.config.seq = rc.seq;
    o.config = take(validate(o.config, rc.model.layers));
    in.run.check_ckpt_partition(o.placement, o.config.mp);
    rc.bsz = int(o.config.bsz);
  }
  // Seed 004's what-ifs change the schedule's collective bytes and attention FLOPs; the
  // executor implements neither, so it refuses them rather than run something else.
  const std::string whence = in.plan.empty() ? "" : in.plan + ": ";
  if (o.config.what_if.onebit_adam)
    throw UsageError(whence + (in.plan.empty() ? "--onebit-adam" : "training.onebit_adam") +
                     ": 1-bit Adam is a what-if for plan and simulate; the executor does not compress gradients");
  if (o.config.what_if.attention_density != 1)
    throw UsageError(whence + (in.plan.empty() ? "--attention-density" : "training.attention_density") +
                     ": block-sparse attention is a what-if for plan and simulate; the executor runs dense "
                     "attention");
o.model = rc.model;
  o.model.max_seq = rc.seq;
  o.profile = profile;
  o.backend = rc.backend;
  o.compute = rc.compute;
  o.precision = rc.precision;
  o.capacity_bytes = rc.capacity_bytes;
  o.lr = rc.lr;
  o.lr_schedule = rc.lr_schedule;
  if (o.lr_schedule.decay_steps == 0) o.lr_schedule.decay_steps = rc.steps;  // the decay ends with the run
  o.weight_decay = rc.weight_decay;
  o.seed = rc.seed;
  o.nvme_dir = in.nvme_dir;
  return PreparedRun{rc, o};
}

nlohmann::ordered_json step_line(int step, const exec::IterationReport& r, double tokens_per_s) {
  nlohmann::ordered_json j = {{"type", "step"},
                              {"step", step},
                              {"loss", r.loss},
                              {"lr", r.lr},
                              {"iteration_s", r.iteration_s},
                              {"tokens_per_s", tokens_per_s},
                              {"compute_s", r.overlap.compute_s},
                              {"hidden_fraction", r.overlap.hidden_fraction},
                              {"threads", r.threads}};
  if (std::isfinite(r.grad_norm)) j["grad_norm"] = r.grad_norm;  // clipping: the norm before it
  return j;
}

const char* const kCpuBusyCaveat =
    "(cpu backend: kernels run on the dispatcher's own thread, so a transfer is seen complete only\n"
    " when the kernel beside it ends; measured busy times are upper bounds, achieved rates lower bounds)\n";

Throughput run_throughput(const exec::Engine& engine, const HardwareProfile& profile, double iteration_s,
                          double train_tokens) {
  const Schedule& s = engine.schedule();
  TrainingConfig c = s.config;
  c.dp = engine.ranks();
  c.grad_accum = engine.micro_batches_per_iteration();  // l2l's micro-batches and accumulation alike
  const exec::GptConfig& g = engine.plan().options.model;
  c.seq = g.max_seq;
  // on a GPU, that GPU's datasheet (a cuda run's profile is often local-cpu or a calibrated one)
  const exec::BackendCaps& caps = engine.backend_caps();
  return throughput(exec::gpt_model_spec(g), c, profile, iteration_s, s.compute_flops, train_tokens,
                    caps.name == "cuda" ? std::string_view(caps.device) : std::string_view());
}

std::string steady_statistic(int first_step, int last_step) {
  const int steady_first = first_step + int(steady_from(std::size_t(last_step - first_step + 1)));
  return steady_first == last_step ? "step " + std::to_string(last_step)
                                   : "median of steps " + std::to_string(steady_first) + "-" + std::to_string(last_step);
}

void print_line(const nlohmann::ordered_json& j) { std::cout << j.dump() << std::endl; }

}  // namespace memwall::cli
