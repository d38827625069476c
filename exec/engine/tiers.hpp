// Tiers: where the engine's bytes live. The model states on their tiers (device memory, host memory
// registered with the backend, swap files on NVMe through the io engine), laid out by the
// schedule's unit and chunk tables (converted to whole elements once, checked), and the buffer
// arenas the memory plan sized: one range of device memory and one of pinned host memory, a
// buffer at `base + Buffer::offset`. Nothing is allocated after create and nothing searches for
// room. Also the states as a checkpoint stores them, and their initial values (Sec. 7.2).
// Owns the device block, host regions, pinned buffer, io engine and swap files; not the backend.
// Thread-safety: the dispatcher's thread; the host lane reads states a step hands it.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/backend.hpp"
#include "exec/gpt/gpt.hpp"
#include "exec/io/io_engine.hpp"
#include "exec/io/pinned_pool.hpp"
#include "exec/io/swap_file.hpp"
#include "exec/io/temp_file.hpp"
#include "exec/io/user_files.hpp"
#include "model/schedule.hpp"

namespace memwall::exec {

struct EngineOptions;

// A schedule unit (ScheduleUnit) in whole elements, with the GPT's parameter group it belongs to.
struct UnitLayout {
  std::size_t group = 0;  // gpt_param_groups index
  int tile = -1;
  std::size_t elems = 0, shard = 0, from = 0, len = 0, whole_at = 0, part_at = 0;
  int root = -1;
};
struct PieceLayout {
  std::size_t unit = 0, from = 0, count = 0;
};
// A schedule chunk (ScheduleChunk) in whole elements and bytes.
struct ChunkLayout {
  std::size_t start = 0, count = 0;
  std::vector<PieceLayout> pieces;
  std::vector<std::size_t> grad_at, param_at;
};

// Host memory for model states kept in CPU memory (zeroed; io::map_host_memory: 2 MiB aligned,
// huge pages where the kernel gives them).
struct HostRegion {
  char* p = nullptr;
  std::size_t bytes = 0;
  HostRegion() = default;
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;
  ~HostRegion();
  bool make(std::size_t n);
};

class Tiers {
 public:
  Tiers() = default;
  Tiers(const Tiers&) = delete;
  Tiers& operator=(const Tiers&) = delete;
  ~Tiers();

  // The layout of `s` (its units and chunks) in whole elements of `model`, the slice of o.model this
  // rank holds (mp_slice); refuses what does not split into whole elements per rank (naming the
  // flag to change). rank, dp: the data-parallel group's; file_rank: the job's rank, which names
  // this rank's swap files.
  Result<bool> lay_out(const EngineOptions& o, const GptConfig& model, int rank, int dp, int file_rank, const Schedule& s);
  // Swap files (checked against the folder first), the device block (states, then the largest
  // device arena of `plans`), host regions and the pinned arena (the largest CPU arena).
  Result<bool> make(Backend& be, const std::vector<const Schedule*>& plans);
  // Initial values: master parameters from the seed, moments zero, the 16-bit copy rounded from
  // the master, gradients zero; only the elements this rank keeps.
  Result<bool> initialise(adam::CpuAdam& adam);

  // ---- layout ----
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const std::vector<UnitLayout>& units() const { return units_; }
  const std::vector<ChunkLayout>& chunks() const { return chunks_; }
  std::size_t whole_elems() const { return n_whole_; }
  std::size_t elem_bytes() const { return psz_; }
  Tier tier(State s) const;
  bool sharded(State s) const;  // partitioned over dp > 1 ranks
  std::size_t elems_of(State s) const { return sharded(s) ? n_part_ : n_whole_; }
  std::size_t state_bytes(State s) const { return s == State::optim32 ? 12 * elems_of(s) : psz_ * elems_of(s); }
  // Elements of u in this rank's optimizer partition, and where they start in it.
  std::size_t opt_len(const UnitLayout& u) const { return sharded(State::optim32) ? u.len : u.elems; }
  std::size_t opt_at(const UnitLayout& u) const { return sharded(State::optim32) ? u.part_at : u.whole_at; }

  // ---- where things are ----
  char* state_ptr(State s);  // a state resident in device or host memory
  // This rank's part of unit u (a partitioned state), or all of u (a whole one).
  char* unit_in(State s, const UnitLayout& u) { return state_ptr(s) + (sharded(s) ? u.part_at : u.whole_at) * psz_; }
  // Element j of u's optimizer slice in a 16-bit state laid out as that state is.
  char* slice_in(State s, const UnitLayout& u, std::size_t j);
  // A buffer of schedule `s`: its tier's arena base plus the plan's offset.
  char* buffer(const Schedule& s, int id) const;
  io::IoEngine* io() { return ioe_.get(); }
  io::SwapFile& swap(State s) { return s == State::param16 ? *swap_param_ : s == State::grad16 ? *swap_grad_ : *swap_optim_; }

  // ---- sizes ----
  std::size_t host_state_bytes() const;
  std::size_t swap_bytes() const;
  std::size_t device_state_bytes() const { return dev_states_; }
  std::array<std::size_t, kTiers> arena_bytes() const { return arena_; }

  // ---- a state as a checkpoint stores it ----
  // param16 = this rank's kept elements of every unit, in unit order; optim32 = master, momentum,
  // variance, each over this rank's optimizer slices.
  Result<std::vector<char>> read_state(State st);
  Result<bool> write_state(State st, const std::vector<char>& in);
  std::uint64_t state_size(State st) const;
  // fp32 master parameters of this rank's optimizer slices.
  Result<std::vector<float>> master_slices();

 private:
  Result<bool> check_nvme_dir(std::size_t need);
  Result<bool> make_swap_files();
  Result<bool> make_device(const std::vector<const Schedule*>& plans);
  Result<bool> make_host(const std::vector<const Schedule*>& plans);
  Result<bool> pin_host(void* p, std::size_t bytes);
  void init_values(const UnitLayout& u, std::size_t from, std::size_t count, float* out) const;
  Result<bool> round_params(adam::CpuAdam& adam, const float* src, void* dst, std::size_t count) const;
  void upload(State s, std::size_t byte_off, const void* src, std::size_t bytes);

  const EngineOptions* o_ = nullptr;
  Backend* be_ = nullptr;
  int rank_ = 0, dp_ = 1, file_rank_ = 0;
  GptConfig model_;  // this rank's slice
  std::size_t psz_ = 2;
  std::vector<ParamGroup> groups_;
  std::vector<UnitLayout> units_;
  std::vector<ChunkLayout> chunks_;
  std::size_t n_whole_ = 0, n_part_ = 0;

  void* device_block_ = nullptr;
  std::array<char*, 3> dev_state_{};  // param16, grad16, optim32 when on the device
  std::size_t dev_states_ = 0;
  std::array<char*, kTiers> arena_base_{};
  std::array<std::size_t, kTiers> arena_{};
  std::unique_ptr<io::PinnedPool> pool_;
  io::PinnedBuffer pinned_;
  HostRegion host_param_, host_grad_, host_optim_;
  io::FolderLock nvme_lock_;  // before the swap files: they are removed before the lock goes
  std::unique_ptr<io::IoEngine> ioe_;
  std::optional<io::SwapFile> swap_param_, swap_grad_, swap_optim_;
  // Swap files this engine made: removed when it ends, however it ends, and on SIGINT/SIGTERM/SIGHUP.
  std::vector<std::unique_ptr<io::TempFileGuard>> swap_guards_;
  std::vector<void*> registered_;  // host memory registered with the backend
};

}  // namespace memwall::exec
