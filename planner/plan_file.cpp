#include "planner/plan_file.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "model/schedule.hpp"
#include "model/units.hpp"
#include "model/yaml_reader.hpp"

namespace memwall::planner {
namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

Plan read_plan(const YamlReader& r, const HardwareProfile* profile) {
  const YAML::Node& root = r.root();
  r.only_keys(root, "", {"version", "profile", "nodes", "gpus", "objective", "model", "placement", "training", "predicted"});
  r.integer(root, "", "version", 1, 1);  // the only plan format so far
  Plan plan;
  plan.profile = r.text(root, "", "profile");
  plan.nodes = int(r.integer_or(root, "", "nodes", 1, kMaxNodes, 1));
  plan.gpus = int(r.integer(root, "", "gpus", 1, kMaxGpus));
  plan.objective = r.text_or(root, "", "objective", "throughput");
  if (plan.objective != "throughput" && plan.objective != "max-model")
    r.fail(root["objective"], "objective", "expected throughput or max-model, got \"" + plan.objective + "\"");

  YAML::Node mn = r.section(root, "", "model");
  ModelSpec& m = plan.model;
  m.name = r.text_or(mn, "model", "name", "custom");
  m.source = r.source();
  read_model_fields(r, mn, "model", m);

  YAML::Node pn = r.section(root, "", "placement");
  r.only_keys(pn, "placement", {"name", "fetch", "param16", "grad16", "optim32", "act_ckpt"});
  Placement& pl = plan.candidate.placement;
  pl.name = r.text_or(pn, "placement", "name", "custom");
  const std::string fetch = r.text_or(pn, "placement", "fetch", "allgather");
  if (fetch != "allgather" && fetch != "broadcast")
    r.fail(pn["fetch"], "placement.fetch", "expected allgather or broadcast, got \"" + fetch + "\"");
  pl.fetch = fetch == "broadcast" ? ParamFetch::broadcast : ParamFetch::allgather;
  for (State s : kAllStates) {
    const std::string path = std::string("placement.") + to_string(s);
    YAML::Node sn = r.section(pn, "placement", to_string(s));
    r.only_keys(sn, path, {"tier", "partitioned"});
    Result<Tier> t = parse_tier(r.text(sn, path, "tier"));
    if (!t) r.fail(sn["tier"], path + ".tier", t.error());
    pl.of(s) = {*t, r.boolean_or(sn, path, "partitioned", false)};
  }
  if (Result<Placement> ok = validate(pl); !ok) r.fail(pn, "placement", ok.error());

  YAML::Node tn = r.section(root, "", "training");
  r.only_keys(tn, "training",
              {"bsz", "ci", "tiling_factor", "dp", "mp", "prefetch_depth", "optimizer_overlap", "dpu_warmup",
               "optimizer_chunks", "onebit_adam", "attention_density", "grad_accum", "global_batch", "pp", "virtual_stages", "ep",
               "grad_clip", "embedding"});
  TrainingConfig& c = plan.candidate.config;
  c.seq = m.seq;
  c.bsz = r.positive_number(tn, "training", "bsz", kMaxBsz);
  c.ci = int(r.integer(tn, "training", "ci", 1, m.layers));
  c.tiling_factor = int(r.integer_or(tn, "training", "tiling_factor", 1, kMaxTiling, 1));
  c.dp = int(r.integer(tn, "training", "dp", 1, kMaxGpus));
  c.mp = int(r.integer_or(tn, "training", "mp", 1, kMaxMp, 1));
  const std::string embedding = r.text_or(tn, "training", "embedding", "sliced");
  if (embedding != "sliced" && embedding != "replicated")
    r.fail(tn["embedding"], "training.embedding", "expected sliced (by vocabulary over mp) or replicated, got \"" +
                                                       embedding + "\"");
  c.embedding_replicated = embedding == "replicated";
  c.prefetch_depth = int(r.integer_or(tn, "training", "prefetch_depth", 0, kMaxPrefetchDepth, 3));
  c.grad_accum = int(r.integer_or(tn, "training", "grad_accum", 1, kMaxGradAccum, 1));
  c.pp = int(r.integer_or(tn, "training", "pp", 1, std::min(kMaxPp, m.layers), 1));
  c.virtual_stages = int(r.integer_or(tn, "training", "virtual_stages", 1, std::max(1, m.layers / c.pp), 1));
  c.ep = int(r.integer_or(tn, "training", "ep", 1, kMaxExperts, 1));
  if (c.ep > 1 && (!m.is_moe() || m.moe.experts % c.ep != 0 || c.dp % c.ep != 0))
    r.fail(tn["ep"], "training.ep",
           m.is_moe() ? "expected a divisor of the model's " + std::to_string(m.moe.experts) + " experts and of dp " +
                            std::to_string(c.dp)
                      : std::string("expert parallelism needs a mixture of experts (the model has none)"));
  if (YAML::Node gb = tn["global_batch"]; gb.IsDefined() && !gb.IsNull()) {
    plan.global_batch = r.integer(tn, "training", "global_batch", 1, long(kMaxBsz) * kMaxGradAccum * kMaxGpus);
    if (double(*plan.global_batch) != global_batch(c))
      r.fail(gb, "training.global_batch",
             "expected bsz x grad_accum x dp = " + format_g(c.bsz) + " x " + std::to_string(c.grad_accum) + " x " +
                 std::to_string(c.dp) + " = " + format_g(global_batch(c)) + ", got " + std::to_string(*plan.global_batch));
  }
  const std::string overlap = r.text_or(tn, "training", "optimizer_overlap", "none");
  Result<OptimizerOverlap> ov = parse_optimizer_overlap(overlap);
  if (!ov) r.fail(tn["optimizer_overlap"], "training.optimizer_overlap", "expected none, backward or dpu, got \"" + overlap + "\"");
  c.optimizer_overlap = *ov;
  c.dpu_warmup = int(r.integer_or(tn, "training", "dpu_warmup", 0, kMaxDpuWarmup, 40));
  c.optimizer_chunks = int(r.integer_or(tn, "training", "optimizer_chunks", 0, kMaxOptimizerChunks, 0));
  if (YAML::Node gc = tn["grad_clip"]; gc.IsDefined() && !gc.IsNull()) {
    c.grad_clip = r.positive_number(tn, "training", "grad_clip", kMaxGradClip);
    if (Result<bool> ok = check_optimizer_overlap(pl, c.optimizer_overlap, c.grad_clip); !ok)
      r.fail(tn["optimizer_overlap"], "training.optimizer_overlap", ok.error());
  }
  c.what_if.onebit_adam = r.boolean_or(tn, "training", "onebit_adam", false);
  c.what_if.attention_density = r.positive_number_or(tn, "training", "attention_density", 1.0, 1.0);
  const long gpus = long(c.dp) * c.mp * c.pp;
  if (gpus != plan.gpus)
    r.fail(root["gpus"], "gpus",
           "expected training.dp x training.mp" + std::string(c.pp > 1 ? " x training.pp" : "") + " = " +
               std::to_string(c.dp) + " x " + std::to_string(c.mp) + (c.pp > 1 ? " x " + std::to_string(c.pp) : "") +
               " = " + std::to_string(gpus) + ", got " + std::to_string(plan.gpus));
  // The schedule this plan makes must fit in this machine's memory (tiling x layers bounds it) and
  // look no further ahead than a pass: blame the field the message's flag stands for.
  if (Result<TrainingConfig> ok = validate(c, m.layers); !ok) {
    const std::string& e = ok.error();
    const bool depth = e.starts_with("--prefetch-depth"), tiling = e.starts_with("--tiling"),
               accum = e.starts_with("--grad-accum"), chunks = e.starts_with("--virtual-stages");
    const std::string field = depth    ? "training.prefetch_depth"
                              : tiling ? "training.tiling_factor"
                              : accum  ? "training.grad_accum"
                              : chunks ? "training.virtual_stages"
                                       : "model.layers";
    r.fail(depth    ? tn["prefetch_depth"]
           : tiling ? tn["tiling_factor"]
           : accum  ? tn["grad_accum"]
           : chunks ? tn["virtual_stages"]
                    : mn["layers"],
           field,
           e.substr(e.find(": ") + 2));
  }

  if (YAML::Node pr = root["predicted"]; pr.IsDefined() && !pr.IsNull()) {
    if (!pr.IsMap()) r.fail(pr, "predicted", "expected a mapping of fields");
    r.only_keys(pr, "predicted", {"ranking", "iteration_s", "tflops_per_gpu", "simulated_iteration_s",
                                  "simulated_tflops_per_gpu", "samples_per_s", "fits"});
    // 0.000 is what plan_yaml prints for a tiny model's iteration: allowed
    auto estimate = [&](const char* key) {
      YAML::Node n = pr[key];
      if (!n.IsDefined() || n.IsNull()) return 0.0;
      Result<double> v = n.IsScalar() ? parse_quantity(n.Scalar(), Dimension::count) : Result<double>(make_error(""));
      if (!v || *v < 0 || *v > 1e18)
        r.fail(n, std::string("predicted.") + key, "expected a number from 0 to 1e18, got \"" +
                                                       (n.IsScalar() ? n.Scalar() : std::string("a mapping or list")) + "\"");
      return *v;
    };
    plan.predicted_iteration_s = estimate("iteration_s");
    plan.predicted_tflops_per_gpu = estimate("tflops_per_gpu");
    if (pr["simulated_iteration_s"].IsDefined()) plan.simulated_iteration_s = estimate("simulated_iteration_s");
    if (pr["simulated_tflops_per_gpu"].IsDefined()) plan.simulated_tflops_per_gpu = estimate("simulated_tflops_per_gpu");
    if (YAML::Node rk = pr["ranking"]; rk.IsDefined()) {
      if (!rk.IsScalar() || (rk.Scalar() != "analytic" && rk.Scalar() != "simulated"))
        r.fail(rk, "predicted.ranking", "expected analytic or simulated");
      plan.ranking = rk.Scalar();
      if (plan.ranking == "simulated" && !plan.simulated_iteration_s)
        r.fail(rk, "predicted.ranking", "simulated, but no predicted.simulated_iteration_s");
    }
  }

  if (profile) {
    const HardwareProfile& p = *profile;
    if (plan.profile != p.name && plan.profile != p.source)
      r.fail(root["profile"], "profile", "plan was made for \"" + plan.profile + "\", checked against \"" + p.name + "\"");
    if (plan.nodes != p.nodes)
      r.fail(root["nodes"].IsDefined() ? root["nodes"] : root["profile"], "nodes",
             "plan names " + std::to_string(plan.nodes) + " node(s), profile " + p.name + " has " +
                 std::to_string(p.nodes) + " (scale it with --nodes " + std::to_string(plan.nodes) + ")");
    if (plan.gpus > p.total_gpus())
      r.fail(root["gpus"], "gpus", "plan names " + std::to_string(plan.gpus) + " GPUs, profile " + p.name + " has " +
                                       std::to_string(p.total_gpus()));
    if (c.mp > p.gpus_per_node || p.gpus_per_node % c.mp != 0)
      r.fail(tn["mp"], "training.mp", "expected a divisor of the node's " + std::to_string(p.gpus_per_node) +
                                          " GPUs (tensor slicing stays inside a node), got " + std::to_string(c.mp));
  }
  return plan;
}

}  // namespace

std::string plan_yaml(const Plan& plan) {
  const ModelSpec& m = plan.model;
  const Placement& pl = plan.candidate.placement;
  const TrainingConfig& c = plan.candidate.config;
  std::ostringstream o;
  o << "# memwall plan: what `memwall simulate --plan` and `memwall run --plan` take.\n"
    << "version: 1\n"
    << "profile: " << yaml_scalar(plan.profile) << "\n"
    << "nodes: " << plan.nodes << "\n"
    << "gpus: " << plan.gpus << "              # dp x mp x pp\n"
    << "objective: " << plan.objective << "\n"
    << "model:\n"
    << model_yaml(m, "  ")
    << "placement:\n"
    << "  name: " << yaml_scalar(pl.name) << "\n"
    << "  fetch: " << (pl.fetch == ParamFetch::broadcast ? "broadcast" : "allgather") << "\n";
  for (State s : kAllStates)
    o << "  " << to_string(s) << ": {tier: " << to_string(pl.of(s).tier)
      << ", partitioned: " << (pl.of(s).partitioned ? "true" : "false") << "}\n";
  o << "training:\n"
    << "  bsz: " << format_g(c.bsz) << "               # micro-batch per GPU\n"
    << "  ci: " << c.ci << "                # transformer blocks between checkpoints\n"
    << "  tiling_factor: " << c.tiling_factor << "\n"
    << "  dp: " << c.dp << "\n"
    << "  mp: " << c.mp << "\n"
    << (c.mp > 1 && c.embedding_replicated ? "  embedding: replicated   # whole on every mp rank (memwall run's)\n"
                                           : std::string())
    << "  pp: " << c.pp << "                # pipeline stages\n"
    << (c.virtual_stages > 1 ? "  virtual_stages: " + std::to_string(c.virtual_stages) +
                                   "    # interleaved 1F1B: chunks of blocks per stage\n"
                             : std::string())
    << (c.ep > 1 ? "  ep: " + std::to_string(c.ep) + "                # expert parallelism: experts split over ep dp ranks\n"
                 : std::string())
    << "  prefetch_depth: " << c.prefetch_depth << "\n"
    << "  grad_accum: " << c.grad_accum << "        # forward/backward micro-steps per optimizer step\n";
  if (plan.global_batch)
    o << "  global_batch: " << *plan.global_batch << "   # bsz x grad_accum x dp, fixed by --global-batch\n";
  o << "  optimizer_overlap: " << to_string(c.optimizer_overlap)
    << (c.optimizer_overlap == OptimizerOverlap::dpu ? "   # one step stale after warm-up: changes the training dynamics\n"
                                                      : "\n");
  if (c.optimizer_overlap == OptimizerOverlap::dpu) o << "  dpu_warmup: " << c.dpu_warmup << "\n";
  if (c.optimizer_chunks > 0) o << "  optimizer_chunks: " << c.optimizer_chunks << "\n";
  if (c.grad_clip > 0)
    o << "  grad_clip: " << format_g(c.grad_clip) << "   # gradients scaled to this global L2 norm at most (clip_grad_norm_)\n";
if (c.what_if.onebit_adam)
    o << "  onebit_adam: true     # what-if (seed 004): compressed gradient collectives; plan and simulate only\n";
  if (c.what_if.attention_density < 1)
    o << "  attention_density: " << format_g(c.what_if.attention_density)
      << "   # what-if (seed 004): block-sparse attention; plan and simulate only\n";
  o << "predicted:\n"
    << "  ranking: " << plan.ranking
    << (plan.ranking == "simulated" ? "   # chosen by simulated time (memwall plan --simulate-top)\n"
                                    : "    # chosen by the analytic estimate\n")
    << "  iteration_s: " << fixed(plan.predicted_iteration_s, 3) << "   # analytic (Sec. 4-6)\n"
    << "  tflops_per_gpu: " << fixed(plan.predicted_tflops_per_gpu, 2) << "\n";
  if (plan.simulated_iteration_s)
    o << "  simulated_iteration_s: " << fixed(*plan.simulated_iteration_s, 3) << "   # memwall simulate\n";
  if (plan.simulated_tflops_per_gpu)
    o << "  simulated_tflops_per_gpu: " << fixed(*plan.simulated_tflops_per_gpu, 2) << "\n";
  return o.str();
}

Result<Plan> parse_plan(std::string_view yaml_text, const std::string& source, const HardwareProfile* profile) {
  try {
    YamlReader reader(source, yaml_text);
    return read_plan(reader, profile);
  } catch (const InputError& e) {
    return make_error(e.what());
  } catch (const YAML::Exception& e) {
    return make_error(source + ": " + e.what());
  }
}

Result<Plan> load_plan(const std::string& path, const HardwareProfile* profile) {
  Result<std::string> text = read_input_file(path, "plan");
  if (!text) return make_error(text.error());
  return parse_plan(*text, path, profile);
}

}  // namespace memwall::planner
