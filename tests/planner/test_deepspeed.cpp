// The DeepSpeed export against what DeepSpeed 0.19's config classes accept (read from
// deepspeedai/DeepSpeed at edaa7221, v0.19.5-27; file:line below). zero_optimization, its
// offload_param / offload_optimizer and fp16 are pydantic models with extra="forbid"
// (runtime/config_utils.py:105-113): an unknown key there is an error. The top level, aio,
// activation_checkpointing and optimizer are read with dict.get: an unknown key there is silently
// ignored, which is worse (aio.thread_count, renamed intra_op_parallelism in 0.16.4, did nothing).
// Every exported config of a grid of plans is held against those keys, types and ranges, and
// against the rules the classes and engine enforce (NVMe only in stage 3, the batch equation).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/placement.hpp"
#include "planner/deepspeed.hpp"
#include "planner/plan_file.hpp"
#include "planner/search.hpp"

namespace memwall::planner {
namespace {

using json = nlohmann::ordered_json;
enum class Kind { boolean, count, number, text, device, object, list };
using Keys = std::map<std::string, Kind>;

// zero/config.py:95-376 (the stage3_* names are the fields' aliases; populate_by_name accepts both)
const Keys kZero = {{"stage", Kind::count}, {"contiguous_gradients", Kind::boolean}, {"reduce_scatter", Kind::boolean},
                    {"reduce_bucket_size", Kind::count}, {"allgather_partitions", Kind::boolean},
                    {"allgather_bucket_size", Kind::count}, {"overlap_comm", Kind::boolean},
                    {"load_from_fp32_weights", Kind::boolean}, {"elastic_checkpoint", Kind::boolean},
                    {"offload_param", Kind::object}, {"offload_optimizer", Kind::object}, {"sub_group_size", Kind::count},
                    {"stage3_prefetch_bucket_size", Kind::count}, {"stage3_param_persistence_threshold", Kind::count},
                    {"stage3_model_persistence_threshold", Kind::count}, {"stage3_max_live_parameters", Kind::count},
                    {"stage3_max_reuse_distance", Kind::count}, {"stage3_gather_16bit_weights_on_model_save", Kind::boolean},
                    {"ignore_unused_parameters", Kind::boolean}, {"round_robin_gradients", Kind::boolean}};
// zero/offload_config.py:24-45
const Keys kOffloadParam = {{"device", Kind::device}, {"nvme_path", Kind::text}, {"buffer_count", Kind::count},
                            {"buffer_size", Kind::count}, {"max_in_cpu", Kind::count}, {"pin_memory", Kind::boolean}};
// zero/offload_config.py:58-105
const Keys kOffloadOptimizer = {{"device", Kind::device}, {"nvme_path", Kind::text}, {"buffer_count", Kind::count},
                                {"pin_memory", Kind::boolean}, {"pipeline_read", Kind::boolean},
                                {"pipeline_write", Kind::boolean}, {"fast_init", Kind::boolean}, {"ratio", Kind::number},
                                {"super_offload", Kind::boolean}, {"cpuadam_cores_perc", Kind::number}};  // :102, :105
// swap_tensor/constants.py:8-30
const Keys kAio = {{"block_size", Kind::count}, {"queue_depth", Kind::count}, {"intra_op_parallelism", Kind::count},
                   {"single_submit", Kind::boolean}, {"overlap_events", Kind::boolean}, {"use_gds", Kind::boolean}};
// activation_checkpointing/config.py:27-43
const Keys kCheckpointing = {{"partition_activations", Kind::boolean}, {"contiguous_memory_optimization", Kind::boolean},
                             {"cpu_checkpointing", Kind::boolean}, {"number_checkpoints", Kind::count},
                             {"synchronize_checkpoint_boundary", Kind::boolean}, {"profile", Kind::boolean}};
// runtime/precision_config.py (fp16)
const Keys kFp16 = {{"enabled", Kind::boolean}, {"auto_cast", Kind::boolean}, {"loss_scale", Kind::number},
                    {"initial_scale_power", Kind::count}, {"loss_scale_window", Kind::count}, {"hysteresis", Kind::count},
                    {"consecutive_hysteresis", Kind::boolean}, {"min_loss_scale", Kind::number}};
// runtime/precision_config.py:41-71 (bf16)
const Keys kBf16 = {{"enabled", Kind::boolean}, {"immediate_grad_update", Kind::boolean},
                    {"check_grad_overflow", Kind::boolean}, {"bf16_master_weights_and_grads", Kind::boolean},
                    {"bf16_optimizer_states", Kind::boolean}};
// runtime/config.py:440-479 and ops/adam/cpu_adam.py:16-25 (params are the optimizer's kwargs)
const Keys kOptimizer = {{"type", Kind::text}, {"params", Kind::object}, {"legacy_fusion", Kind::boolean}};
const Keys kAdamParams = {{"lr", Kind::number}, {"betas", Kind::list}, {"eps", Kind::number},
                          {"weight_decay", Kind::number}, {"bias_correction", Kind::boolean}, {"amsgrad", Kind::boolean},
                          {"adam_w_mode", Kind::boolean}, {"torch_adam", Kind::boolean}};
// runtime/config.py:796-923 (the keys this exporter may write)
const Keys kTop = {{"train_batch_size", Kind::count}, {"train_micro_batch_size_per_gpu", Kind::count},
                   {"gradient_accumulation_steps", Kind::count}, {"optimizer", Kind::object}, {"fp16", Kind::object},
                   {"bf16", Kind::object}, {"zero_optimization", Kind::object}, {"activation_checkpointing", Kind::object},
                   {"aio", Kind::object}, {"gradient_clipping", Kind::number}};

// Every key of `j` is one of `keys` with a value of its kind; returns the problems.
std::vector<std::string> check_keys(const json& j, const Keys& keys, const std::string& where) {
  std::vector<std::string> bad;
  if (!j.is_object()) return {where + ": not an object"};
  for (const auto& [k, v] : j.items()) {
    auto it = keys.find(k);
    if (it == keys.end()) {
      bad.push_back(where + "." + k + ": not a key DeepSpeed reads");
      continue;
    }
    bool ok = true;
    switch (it->second) {
      case Kind::boolean: ok = v.is_boolean(); break;
      case Kind::count: ok = v.is_number_integer() && v.get<long long>() >= 0; break;  // pydantic int, ge=0
      case Kind::number: ok = v.is_number() && std::isfinite(v.get<double>()); break;
      case Kind::text: ok = v.is_string() && !v.get<std::string>().empty(); break;
      case Kind::device: ok = v.is_string() && std::set<std::string>{"none", "cpu", "nvme"}.count(v.get<std::string>()); break;
      case Kind::object: ok = v.is_object(); break;
      case Kind::list: ok = v.is_array(); break;
    }
    if (!ok) bad.push_back(where + "." + k + ": value " + v.dump() + " is not what DeepSpeed accepts");
  }
  return bad;
}

// The keys above, then the rules DeepSpeed enforces or silently depends on.
std::vector<std::string> check_config(const json& ds, const ModelSpec& m, const Candidate& c) {
  std::vector<std::string> bad = check_keys(ds, kTop, "");
  auto add = [&](std::vector<std::string> more) { bad.insert(bad.end(), more.begin(), more.end()); };
  const json& z = ds["zero_optimization"];
  add(check_keys(z, kZero, "zero_optimization"));
  // runtime/config.py:827-828: "bfloat16 and fp16 modes cannot be simultaneously enabled"
  if (ds.contains("fp16") == ds.contains("bf16")) bad.push_back("exactly one of fp16 and bf16 must be enabled");
  if (ds.contains("fp16")) add(check_keys(ds["fp16"], kFp16, "fp16"));
  if (ds.contains("bf16")) add(check_keys(ds["bf16"], kBf16, "bf16"));
  add(check_keys(ds["activation_checkpointing"], kCheckpointing, "activation_checkpointing"));
  add(check_keys(ds["optimizer"], kOptimizer, "optimizer"));
  add(check_keys(ds["optimizer"]["params"], kAdamParams, "optimizer.params"));
  const std::string type = ds["optimizer"]["type"].get<std::string>();
  if (type != "Adam" && type != "AdamW") bad.push_back("optimizer.type: " + type + " is not Adam or AdamW");
  const int stage = z["stage"].get<int>();
  if (stage < 0 || stage > 3) bad.push_back("zero_optimization.stage out of 0-3");
  bool nvme = false;
  for (const char* section : {"offload_param", "offload_optimizer"}) {
    if (!z.contains(section)) continue;
    const json& o = z[section];
    add(check_keys(o, std::string(section) == "offload_param" ? kOffloadParam : kOffloadOptimizer,
                   std::string("zero_optimization.") + section));
    if (o["device"] == "nvme") {
      nvme = true;
      // stage_1_and_2.py:186-191: any device but none is CPU offload there; only stage3.py:777 swaps
      if (stage != 3) bad.push_back(std::string(section) + ": device nvme in stage " + std::to_string(stage));
      if (!o.contains("nvme_path")) bad.push_back(std::string(section) + ": nvme without nvme_path");
    }
    if (o.contains("ratio") && !(o["ratio"].get<double>() >= 0 && o["ratio"].get<double>() <= 1))
      bad.push_back("offload_optimizer.ratio outside [0, 1]");
    // stage3.py:441-442, 796: the pipelined swapper exists only for NVMe optimizer states in stage 3;
    // elsewhere pipeline_read/pipeline_write are silently ignored
    if ((o.contains("pipeline_read") || o.contains("pipeline_write")) && (o["device"] != "nvme" || stage != 3))
      bad.push_back(std::string(section) + ": pipeline_read/pipeline_write without NVMe in stage 3 (ignored)");
    // engine.py:2477-2479: SuperOffload's optimizer only in stage 3; superoffload_stage3.py:168
    // steps asynchronously only without gradient clipping (gradient_clipping defaults to 1.0)
    if (o.value("super_offload", false)) {
      if (stage != 3) bad.push_back("super_offload outside stage 3 is ignored");
      if (!ds.contains("gradient_clipping") || ds["gradient_clipping"].get<double>() != 0)
        bad.push_back("super_offload with gradient clipping steps after backward (gradient_clipping must be 0)");
    }
  }
  if (z.contains("offload_param") && stage != 3) bad.push_back("offload_param outside stage 3 is ignored");
  if (z.contains("offload_param") && z["offload_param"].contains("buffer_size")) {
    // partitioned_param_swapper.py:357: every swapped partition must fit one buffer
    Candidate exported = c;
    exported.placement.param16.partitioned = true;
    if (z["offload_param"]["buffer_size"].get<double>() < largest_partition_elems(m, exported, State::param16))
      bad.push_back("offload_param.buffer_size below the largest parameter partition");
  }
  if (nvme != ds.contains("aio")) bad.push_back(nvme ? "NVMe offload without an aio section" : "aio without NVMe");
  if (ds.contains("aio")) add(check_keys(ds["aio"], kAio, "aio"));
  // config.py:937-940: train_batch_size == micro x gas x data-parallel size
  if (ds["train_batch_size"].get<long>() !=
      ds["train_micro_batch_size_per_gpu"].get<long>() * ds["gradient_accumulation_steps"].get<long>() * c.config.dp)
    bad.push_back("train_batch_size is not micro-batch x gradient accumulation x dp");
  if (ds["gradient_accumulation_steps"].get<long>() != c.config.grad_accum)
    bad.push_back("gradient_accumulation_steps is not the plan's grad_accum");
  const json& ac = ds["activation_checkpointing"];
  if (ac["cpu_checkpointing"].get<bool>() && !ac["partition_activations"].get<bool>())
    bad.push_back("cpu_checkpointing without partition_activations");
  if (ac["contiguous_memory_optimization"].get<bool>() &&
      !(ac["partition_activations"].get<bool>() && ac.contains("number_checkpoints")))
    bad.push_back("contiguous_memory_optimization without partition_activations and number_checkpoints");
  return bad;
}

TEST(DeepSpeed, EveryExportedKeyIsOneDeepSpeedReads) {
  int exported = 0;
  for (const char* model : {"table1-10B", "table1-1T", "table4-13B"}) {
    const ModelSpec m = *load_model(model);
    std::vector<std::pair<std::string, Placement>> placements;
    for (const std::string& name : preset_names()) placements.emplace_back(name, *preset(name));
    Placement stage2_nvme = *preset("zero2");  // the plan the old export mislabelled as stage 2
    stage2_nvme.optim32.tier = Tier::nvme;
    placements.emplace_back("zero2+optim32=nvme", stage2_nvme);
    Placement ckpt_nvme = *preset("zero_inf_nvme");
    ckpt_nvme.act_ckpt.tier = Tier::nvme;
    if (validate(ckpt_nvme)) placements.emplace_back("zero_inf_nvme+act_ckpt=nvme", ckpt_nvme);
    for (const auto& [name, pl] : placements) {
      if (pl.layer_major) continue;  // l2l is refused (below)
      for (int tiling : {1, 4})
        for (int mp : {1, 4}) {
          if (tiling > 1 && !pl.param16.partitioned) continue;
          Candidate c;
          c.placement = pl;
          c.config.grad_accum = tiling == mp ? 1 : 8;  // memwall plan --global-batch
          c.config.bsz = 2;
          c.config.mp = mp;
          c.config.dp = 64 / mp;
          c.config.tiling_factor = tiling;
          c.config.ci = 2;
          for (OptimizerOverlap ov : {OptimizerOverlap::none, OptimizerOverlap::backward, OptimizerOverlap::dpu})
            for (const char* precision : {"fp16", "bf16"}) {
              c.config.optimizer_overlap = ov;
              Result<DeepSpeedExport> ds = deepspeed_export(m, c, DeepSpeedOptions{"/local_nvme", precision});
              ASSERT_TRUE(ds.ok()) << ds.error();
              for (const std::string& b : check_config(ds->config, m, c))
                ADD_FAILURE() << model << " " << name << " tiling " << tiling << " mp " << mp << " overlap "
                              << to_string(ov) << " " << precision << ": " << b;
              ++exported;
            }
        }
    }
  }
  EXPECT_GT(exported, 240);
}

// Found in issue 17: a stage-2 plan with the optimizer on NVMe (the planner picks it for 13B and 20B
// on dgx-a100, or with --fix optim32=nvme) was exported as stage 2 with offload_optimizer nvme,
// which DeepSpeed runs as CPU offload without a word. It is exported as stage 3, and says so.
TEST(DeepSpeed, StageTwoWithNvmeBecomesStageThreeAndSaysSo) {
  const ModelSpec m = *load_model("table4-13B");
  Candidate c;
  // what `memwall plan --fix strategy=zero2 --fix optim32=nvme` chooses: gradients partitioned on
  // the GPU, optimizer states partitioned on NVMe
  c.placement = *preset("zero2");
  c.placement.optim32.tier = Tier::nvme;
  c.placement.name = "custom";
  ASSERT_TRUE(validate(c.placement).ok()) << validate(c.placement).error();
  c.config.bsz = 4;
  c.config.dp = 8;
  Result<DeepSpeedExport> ds = deepspeed_export(m, c);
  ASSERT_TRUE(ds.ok()) << ds.error();
  EXPECT_EQ(ds->planned_stage, 2);
  EXPECT_EQ(ds->stage, 3);
  EXPECT_EQ(ds->config["zero_optimization"]["stage"], 3);
  EXPECT_EQ(ds->config["zero_optimization"]["offload_optimizer"]["device"], "nvme");
  ASSERT_FALSE(ds->differences.empty());
  EXPECT_NE(ds->differences.front().find("stage 3 instead of the plan's stage 2"), std::string::npos);
  EXPECT_NE(ds->notes().find("DeepSpeed swaps states to NVMe only in stage 3"), std::string::npos) << ds->notes();
  EXPECT_TRUE(check_config(ds->config, m, c).empty());
  // a stage-2 plan with the optimizer in CPU memory is what DeepSpeed runs: no difference
  c.placement = *preset("zero_offload");
  ds = deepspeed_export(m, c);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->stage, 2);
  for (const std::string& d : ds->differences) EXPECT_EQ(d.find("stage 3"), std::string::npos) << d;
}

TEST(DeepSpeed, CodeChangesTheConfigCannotSay) {
  const ModelSpec m = *load_model("table1-1T");
  Candidate c;
  c.placement = *preset("zero_inf_nvme");
  c.config.bsz = 2;
  c.config.mp = 4;
  c.config.dp = 4;
  c.config.tiling_factor = 8;
  c.config.ci = 3;
  Result<DeepSpeedExport> ds = deepspeed_export(m, c);
  ASSERT_TRUE(ds.ok()) << ds.error();
  std::string all;
  for (const std::string& s : ds->code_changes) all += s + "\n";
  EXPECT_NE(all.find("deepspeed.checkpointing.configure"), std::string::npos) << all;
  EXPECT_NE(all.find("every 3 block(s)"), std::string::npos) << all;
  EXPECT_NE(all.find("TiledLinear"), std::string::npos) << all;
  EXPECT_NE(all.find("deepspeed.initialize(mpu="), std::string::npos) << all;
  EXPECT_NE(all.find("DeepSpeedCPUAdam"), std::string::npos) << all;
  EXPECT_FALSE(ds->config["activation_checkpointing"].contains("number_checkpoints"));  // not an interval
  EXPECT_FALSE(ds->config["aio"].contains("thread_count"));                             // ignored since 0.16.4
  EXPECT_EQ(ds->config["aio"]["intra_op_parallelism"], 1);
  // without tiling or slicing those two lines go
  c.config.tiling_factor = 1;
  c.config.mp = 1;
  c.config.dp = 16;
  ds = deepspeed_export(m, c);
  all.clear();
  for (const std::string& s : ds->code_changes) all += s + "\n";
  EXPECT_EQ(all.find("TiledLinear"), std::string::npos) << all;
  EXPECT_EQ(all.find("deepspeed.initialize(mpu="), std::string::npos) << all;
}

TEST(DeepSpeed, OneTbPlanOnNvmeBuffersHoldEveryPartition) {
  const ModelSpec m = *load_model("table1-1T");
  const HardwareProfile p = *load_profile("dgx2");
  SearchResult r = search(m, p, *make_space(m, p, {}));
  ASSERT_TRUE(r.fits());
  const Candidate& c = r.ranked.front().candidate;
  Result<DeepSpeedExport> ds = deepspeed_export(m, c, DeepSpeedOptions{"/local_nvme", "fp16"});
  ASSERT_TRUE(ds.ok()) << ds.error();
  const json& z = ds->config["zero_optimization"];
  EXPECT_EQ(z["stage"], 3);
  EXPECT_EQ(z["offload_param"]["nvme_path"], "/local_nvme");
  // "More elements than buffer size" cannot happen: the buffer holds every parameter partition:
  // the embedding (50257 x 25600) and fc1 (25600 x 102400 / tiling) over 16 ranks.
  const double buffer = z["offload_param"]["buffer_size"].get<double>();
  EXPECT_GE(buffer, 50257.0 * 25600 / 16);
  EXPECT_GE(buffer, 25600.0 * 102400 / c.config.tiling_factor / 16);
  EXPECT_GE(z["sub_group_size"].get<double>(), buffer);
  EXPECT_TRUE(check_config(ds->config, m, c).empty());
}

TEST(DeepSpeed, RefusesWhatNoConfigExpresses) {
  const ModelSpec m = *load_model("table1-10B");
  Candidate c;
  c.placement = *preset("zero2");
  c.config.dp = 16;
  c.config.bsz = 1.25;
  EXPECT_NE(deepspeed_export(m, c).error().find("must be an integer"), std::string::npos);
  c.config.bsz = 1;
  c.placement = *preset("l2l");
  EXPECT_NE(deepspeed_export(m, c).error().find("l2l"), std::string::npos);
  c.placement = *preset("data_parallel");
  EXPECT_EQ((*deepspeed_export(m, c)).config["zero_optimization"]["stage"], 0);
  c.placement = *preset("three_d");  // pipeline stages are model code in DeepSpeed (PipelineModule)
  c.config.mp = 4;
  c.config.pp = 4;
  c.config.dp = 1;
  EXPECT_NE(deepspeed_export(m, c).error().find("PipelineModule"), std::string::npos);
}

// Issue 31: bf16 where the profile's GPU has it (A100, H100), fp16 on V100; --precision overrides,
// and bf16 on a GPU without it is refused.
TEST(DeepSpeed, PrecisionFollowsTheProfilesGpu) {
  EXPECT_EQ(*deepspeed_precision(*load_profile("dgx-a100"), ""), "bf16");
  EXPECT_EQ(*deepspeed_precision(*load_profile("dgx-h100"), ""), "bf16");
  EXPECT_EQ(*deepspeed_precision(*load_profile("dgx2"), ""), "fp16");
  EXPECT_EQ(*deepspeed_precision(*load_profile("dgx-a100"), "fp16"), "fp16");
  EXPECT_NE(deepspeed_precision(*load_profile("dgx2"), "bf16").error().find("has no bf16"), std::string::npos);
  EXPECT_NE(deepspeed_precision(*load_profile("dgx2"), "fp32").error().find("expected bf16 or fp16"), std::string::npos);
  const ModelSpec m = *load_model("table1-10B");
  Candidate c;
  c.placement = *preset("zero3");
  c.config.dp = 8;
  Result<DeepSpeedExport> ds = deepspeed_export(m, c, DeepSpeedOptions{"/local_nvme", "bf16"});
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->config["bf16"]["enabled"], true);
  EXPECT_FALSE(ds->config.contains("fp16"));
}

// Issue 31, found: the plan predicted CPU Adam beside backward and the notes said "Differences:
// none", but stock DeepSpeed steps the optimizer after backward. Planning for DeepSpeed keeps only
// what it runs as planned; the export turns the overlap into SuperOffload where DeepSpeed has it,
// and lists it as a difference where it does not.
TEST(DeepSpeed, PlanningForDeepSpeedKeepsWhatItRuns) {
  const ModelSpec m = *model_from_shape(80, 8192, 64, 4096, 32000);
  const HardwareProfile p = *load_profile("dgx2");
  SearchSpace all = *make_space(m, p, {});
  Result<SearchSpace> ds_space = deepspeed_space(all, false);
  ASSERT_TRUE(ds_space.ok()) << ds_space.error();
  EXPECT_LT(ds_space->placements.size(), all.placements.size());  // NVMe below stage 3, l2l, ... gone
  for (const Placement& pl : ds_space->placements) EXPECT_EQ(deepspeed_cannot(pl), "") << placement_label(pl);
  EXPECT_EQ(ds_space->overlaps, std::vector<OptimizerOverlap>{OptimizerOverlap::none});
  EXPECT_EQ(ds_space->pp, std::vector<int>{1});
  SearchResult mine = search(m, p, all), theirs = search(m, p, *ds_space);
  ASSERT_TRUE(mine.fits() && theirs.fits());
  const Evaluated& a = mine.ranked.front();
  const Evaluated& b = theirs.ranked.front();
  EXPECT_EQ(b.candidate.config.optimizer_overlap, OptimizerOverlap::none);
  EXPECT_EQ(a.candidate.config.optimizer_overlap, OptimizerOverlap::backward);  // memwall's own overlaps
  // DeepSpeed's best cannot beat memwall's: it searches a subset
  EXPECT_LE(b.time.tflops_per_gpu, a.time.tflops_per_gpu * (1 + 1e-9));
  Result<DeepSpeedExport> ex = deepspeed_export(m, b.candidate);
  ASSERT_TRUE(ex.ok());
  EXPECT_TRUE(ex->differences.empty()) << ex->notes();
  EXPECT_FALSE(ex->config["zero_optimization"]["offload_optimizer"].contains("super_offload"));
  EXPECT_FALSE(ex->config.contains("gradient_clipping"));  // DeepSpeed's default (constants.py): 0, none, as planned
  Candidate clipped = b.candidate;
  clipped.config.grad_clip = 0.7;
  EXPECT_EQ(deepspeed_export(m, clipped)->config["gradient_clipping"], 0.7);
  // memwall's own plan: stage 3 with CPU Adam beside backward is SuperOffload, without clipping
  ex = deepspeed_export(m, a.candidate);
  ASSERT_TRUE(ex.ok());
  ASSERT_EQ(ex->stage, 3) << ex->notes();
  EXPECT_EQ(ex->config["zero_optimization"]["offload_optimizer"]["super_offload"], true);
  EXPECT_EQ(ex->config["gradient_clipping"], 0.0);
  EXPECT_TRUE(check_config(ex->config, m, a.candidate).empty());
  // with the optimizer states on NVMe there is no overlapped CPU Adam: a difference, named
  Candidate nvme = a.candidate;
  nvme.placement.optim32.tier = Tier::nvme;
  ex = deepspeed_export(m, nvme);
  ASSERT_TRUE(ex.ok());
  ASSERT_FALSE(ex->differences.empty());
  EXPECT_NE(ex->notes().find("DeepSpeed runs it in step() after backward"), std::string::npos) << ex->notes();
  EXPECT_EQ(ex->config["zero_optimization"]["offload_optimizer"]["pipeline_read"], true);  // the plan's chunk pipeline
  EXPECT_EQ(ex->config["zero_optimization"]["offload_optimizer"]["pipeline_write"], true);
  // dpu: refused when planning for DeepSpeed, a difference in memwall's plan
  all.overlaps = {OptimizerOverlap::dpu};
  EXPECT_NE(deepspeed_space(all, true).error().find("no delayed parameter update"), std::string::npos);
  nvme.config.optimizer_overlap = OptimizerOverlap::dpu;
  EXPECT_NE(deepspeed_export(m, nvme)->notes().find("DeepSpeed has no such mode"), std::string::npos);
}

}  // namespace
}  // namespace memwall::planner
