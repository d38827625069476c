// Engine: the schedule, executed (DESIGN.md "The engine"). plan_rank builds this rank's Schedule of
// model/ for a GPT, a placement, a training config and a profile (with the byte sizes this executor
// really allocates) and refuses what does not fit before touching any data; Engine::create takes
// that plan as built, places the model states on their tiers (the backend's device memory under
// its hard capacity, pinned host memory, swap files on NVMe through the liburing engine with
// O_DIRECT) and the schedule's buffers at the memory plan's offsets, and runs every step of every
// iteration through the handler of its kind (exec/engine/handlers.hpp): a step starts when its
// dependencies are done, so prefetches run ahead of compute as the schedule says, and no order of
// completions can make it fail for memory. It counts the bytes each handler moved per link class,
// the memory held per tier and when each step ran, so an iteration compares with the simulator's
// step by step (`memwall validate` hands the simulator the very schedule the engine runs).
//
// Owns: the backend, the tiers (exec/engine/tiers.hpp), the io engine, CPU Adam, the GPT's
// operators. Does not own: the data (callers pass batches; exec/engine/training.hpp loops).
// Thread-safety: one thread drives an Engine. Inside, copy streams, io_uring workers and a host
// lane for CPU Adam run beside the dispatcher and only report completions to it.
//
// Data-parallel ranks are the processes of an mpirun job (MpiWorld): each builds the schedule of its
// own rank, keeps its shard of every partitioned state (Sec. 6.1, bandwidth-centric partitioning),
// initialises only that (Sec. 7.2), and runs the schedule's gg, reduce-scatter and all-reduce steps
// through Collectives (MPI on the cpu backend, NCCL on cuda), in schedule order on every rank.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exec/adam/adam_types.hpp"
#include "exec/adam/host_cores.hpp"
#include "exec/adam/lr_schedule.hpp"
#include "exec/backend/backend.hpp"
#include "exec/gpt/gpt.hpp"
#include "exec/io/io_engine.hpp"
#include "model/hardware_profile.hpp"
#include "model/placement.hpp"
#include "model/result.hpp"
#include "model/schedule.hpp"
#include "model/timeline.hpp"
#include "model/training_config.hpp"

namespace memwall::exec {

struct EngineContext;

struct EngineOptions {
  GptConfig model;                 // max_seq = the sequence length
  Placement placement;
  TrainingConfig config;           // bsz, seq, ci, tiling, prefetch, micro_batches (l2l); dp 1
  HardwareProfile profile;         // capacities: GPU memory, CPU memory, pinned budget, NVMe
  std::string backend = "cpu";
  ComputeType compute = ComputeType::fp32;
  adam::DType precision = adam::DType::bf16;  // param16 / grad16 storage
  std::size_t capacity_bytes = 0;  // device memory limit; 0 = the profile's GPU memory. The backend's own
                                   // workspaces come out of it: the schedule plans the rest
                                   // (backend_reserved_bytes)
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;  // AdamW; lr the peak
  adam::LrSchedule lr_schedule;    // each update's rate: lr_at(lr_schedule, lr, Adam's step)
  std::uint64_t seed = 1337;       // initial weights
  std::string nvme_dir;            // swap files (needed when any state is on nvme)
  io::EngineOptions io;            // queue depth, block size; `inject` for fault tests
  bool trace = false;              // keep every step's times for a Chrome trace
  bool serial = false;             // debug: issue one step, wait for it, then the next
  bool keep_gradients = false;     // tests: gradients as the optimizer read them (gradients())
  // The watchdog: with nothing completed on any lane or rank for this long, or for 20 times the
  // longest expected time of what is in flight if that is longer, the run stops and says what it
  // waited on (exec/engine/dispatcher.hpp).
  double stall_timeout_s = 120;
  // Host threads of the backend's CPU work (OpenMP, OpenBLAS) and CPU Adam. 0: fit the machine,
  // the cores other processes leave free (exec/adam/host_cores.hpp), looked at over 0.1 s when the
  // engine is made and again after each iteration once 0.2 s have passed since the last look; n:
  // exactly n. Losses do not depend on it: the kernels split elements across threads, never a sum,
  // and the cpu backend's GEMMs are tiles fixed by the shape (backend_cpu.cpp, cpu_gemm).
  int threads = 0;
  // tests: wraps the backend the engine made (a wrapper that delays completions, around the real one)
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;
  double save_pause_s = 0;         // tests: sleep between writing the shards and the manifest
};

// Where a run is, as a checkpoint records it besides the states: the iteration done and the data
// position (the batch generator's state after it).
struct RunPosition {
  int iteration = 0;
  std::uint64_t data_rng = 0;
};

// One iteration, measured. Bytes per link class are counted by the handlers as they complete.
struct IterationReport {
  int iteration = 0;               // 1-based
  float loss = 0;                  // mean cross-entropy of the batch, before the update
  double iteration_s = 0;
  OverlapReport overlap;           // compute, transfer, exposed transfer, hidden fraction
  std::array<double, kLinkClasses> bytes_moved{};
  // This iteration, per tier: what the run held, the states plus the highest end of any buffer
  // placed (the memory plan's arena once every buffer was used; swap files on nvme), and the states
  // plus the most buffer bytes live at once (which depends on how the steps overlapped).
  std::array<double, kTiers> held_bytes{}, live_bytes{};
  std::vector<StepTime> times;     // every step, when options.trace
  int threads = 1;                 // host threads this iteration ran with
  double lr = 0;                   // the rate of this iteration's update (dpu: of the update it ran)
  // Gradient clipping: the global L2 norm of this iteration's gradients before clipping (NaN when
  // the run does not clip)
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
};

struct EngineStats {
  std::size_t device_capacity_bytes = 0;   // the backend's hard limit
  std::size_t device_state_bytes = 0;      // the model states on the device
  std::size_t device_reserved_bytes = 0;   // the backend's own workspaces (BackendCaps::reserved_bytes)
  std::size_t device_high_water_bytes = 0; // reserved + states + most buffer bytes live at once, over the run
  std::size_t device_extent_bytes = 0;     // reserved + states + the highest end of any buffer placed
  std::size_t pinned_high_water_bytes = 0; // most bytes live in the pinned arena
  // Per tier, over the run: the memory plan's arena, the highest end of a buffer placed in it (the
  // plan's offsets: equal to the arena once every buffer has been used), most bytes live at once.
  std::array<std::size_t, kTiers> arena_bytes{}, arena_extent_bytes{}, arena_high_water_bytes{};
  std::size_t host_state_bytes = 0;        // model states resident in host memory
  std::size_t swap_file_bytes = 0;         // on NVMe
  io::IoCounters io;                       // the io engine's own counters (padded to 4 KiB blocks)
  int threads = 1;                         // host threads now (options.threads, or fitted)
  bool threads_fitted = false;             // fitted to the load (options.threads 0)
  adam::CpuLoad load;                      // what other processes did when the engine last looked
};

struct RankTraffic {
  std::array<double, kLinkClasses> moved_bytes{};     // counted by that rank's handlers
  std::array<double, kLinkClasses> schedule_bytes{};  // that rank's schedule
};

// What one rank executes: the options as the engine runs them, and its schedules as built: the
// one object the engine runs and `memwall validate`'s simulator replays.
struct RankPlan {
  EngineOptions options;  // normalised: dp the job's ranks, seq the model's, capacity applied
  int rank = 0, dp = 1;   // this process's data-parallel rank and the dp group's size
  int mp_rank = 0;        // its place in its tensor-slicing group (config.mp ranks)
  int stage = 0;          // its pipeline stage (config.pp); world rank (stage x dp + rank) x mp + mp_rank
  Schedule schedule; // every iteration's (with dpu: after the warm-up)
  std::optional<Schedule> warmup;  // dpu: the ordinary schedule the warm-up iterations run
};

// Builds and checks this rank's schedules with the executor's sizes and refuses, with one line
// naming what to change, what the executor cannot run (tensor slicing, pipelines, accumulation,
// a fractional batch, fp16 on cpu, a tiling that does not divide), a model that does not fit
// (bytes needed and available per tier, and `memwall plan` as the hint) and a pinned budget too
// small for the memory plan's CPU buffers. Touches nothing.
Result<RankPlan> plan_rank(const EngineOptions& options);
// Rank `rank`'s schedule for options plan_rank normalised (RankPlan::options), built and checked as
// plan_rank builds this rank's: what another rank executes (the broadcast variant's ranks differ).
Result<Schedule> rank_schedule(const EngineOptions& normalised, int rank, int stage = 0);

class Engine {
 public:
  // Runs `plan` as built: refuses an unwritable or too small NVMe folder or a device without room
  // for the memory plan, then makes the tiers and initialises the states.
  static Result<std::unique_ptr<Engine>> create(RankPlan plan);
  // plan_rank, then create.
  static Result<std::unique_ptr<Engine>> create(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Schedule& schedule() const;  // the plan's (not the warm-up's)
  const RankPlan& plan() const;
  const BackendCaps& backend_caps() const;
  std::size_t num_params() const;  // the model's, whole (a tensor-slicing rank holds a slice)
  int rank() const;   // this process's data-parallel rank
  int ranks() const;  // dp: the processes of the job (mpirun -np N), 1 without mpirun
  int tokens_per_iteration() const;  // micro_batches_per_iteration() x bsz x seq
  // l2l's micro-batches x gradient accumulation's micro-steps: step() takes them in that order
  int micro_batches_per_iteration() const;

  // One iteration on (micro_batches x bsz, seq) tokens and next-token targets: every step of the
  // schedule, the optimizer included. An I/O or device error stops it with the step, path and
  // offset; the optimizer never runs on data that failed to arrive.
  Result<IterationReport> step(const std::vector<int>& tokens, const std::vector<int>& targets);

  // fp32 master parameters in the parameter array's order (gpt_param_tensors), from their tier;
  // with partitioned optimizer states assembled from every rank (a collective: call on all ranks).
  Result<std::vector<float>> master_params();
  // The gradients the last optimizer step read, as fp32 in the parameter array's order, assembled
  // the same way (options.keep_gradients), and the logits of this rank's micro-batch 0 (B, T, V).
  Result<std::vector<float>> gradients();
  Result<std::vector<float>> logits();

  // Checkpoints that survive offload (DeepSpeed issues #2082, #7549): every rank writes its
  // 16-bit parameters and fp32 optimizer states from wherever they live (device, pinned host
  // memory, swap files) to DIR/step-NNNNNNNN/rankRRRR.{param16,optim32}, fsyncs them, and rank 0
  // writes manifest.json last (sizes, FNV-1a checksums, model, placement, dp, precision, position)
  // through a temporary file, fsync and rename, then points DIR/latest at it the same way; the two
  // newest checkpoints are kept. A run killed during a save leaves the previous one loadable.
  // Collectives: call on every rank.
  Result<bool> save(const std::string& dir, const RunPosition& at);
  // Loads DIR/latest into the tiers after checking that its model, placement, dp, precision and
  // tiling are this run's (naming the field that differs) and that every file has its manifest
  // size and checksum. Returns the position to continue from.
  Result<RunPosition> resume(const std::string& dir);

  EngineStats stats() const;
  // Bytes per link class of every rank in the iteration `r` reported here (a collective: call on
  // all ranks with their own reports).
  Result<std::vector<RankTraffic>> traffic_by_rank(const IterationReport& r);
  // Every step of the last iteration as trace events (options.trace), rank 0.
  std::vector<TraceEvent> trace_events(const IterationReport& r) const;

 private:
  explicit Engine(std::unique_ptr<EngineContext> ctx);
  std::unique_ptr<EngineContext> ctx_;
};

// The sizes a schedule must count for this executor: 16-bit (or fp32) parameters and gradients,
// 12 bytes of fp32 optimizer state per parameter (master, momentum, variance), fp32 activations in
// one workspace of GptOps::workspace_bytes.
MemorySizes executor_sizes(const GptConfig& model, const TrainingConfig& config, adam::DType precision,
                           int micro_batches);

// The sizes a schedule for `profile` counts: executor_sizes at the profile's executor.precision
// when `memwall run` executes its plans (an `executor:` section), else the paper's (MemorySizes{}).
// `memwall plan`, `simulate` and `validate` build their schedules with it, so the schedule they
// check or replay is the one `memwall run` executes.
Result<MemorySizes> schedule_sizes(const HardwareProfile& profile, const ModelSpec& model, const Placement& placement,
                                   const TrainingConfig& config);

}  // namespace memwall::exec
