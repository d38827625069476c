// The optimizer step on this rank's partition (Sec. 5.2.2). With the states on NVMe it runs in
// chunks sized to the pinned buffers: three chunk buffers, so the read of chunk i+1 and the write
// of chunk i-1 overlap the update of chunk i. The list says so too: the reads of the first three
// chunks come first, and the read of chunk i+3 follows the write that frees its buffer.
// When it runs (TrainingConfig::optimizer_overlap): after backward (none); each chunk as soon as
// the gradients of its units are final (backward: emitted from grad_ready); or before forward, on
// the previous iteration's gradients, with the updated parameters copied to the GPU after this
// iteration's last compute (dpu).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/schedule_build.hpp"

namespace memwall::build {

namespace {

Tier ot(const Shape& sh) { return sh.pl.optim32.tier; }
std::string chunk_name(int k) { return "adam[chunk " + std::to_string(k) + "]"; }
double chunk_size(const Builder& b, int k) { return b.e.schedule().optimizer_chunks[size_t(k)].params; }
// Elements of unit u in this rank's optimizer partition: its part when optim32 is partitioned.
double opt_len(const Shape& sh, const ScheduleUnit& u) { return sh.pl.optim32.partitioned ? u.len : u.elems; }

double align_up(double n, double a) { return a <= 1 ? n : std::ceil(n / a) * a; }

// The pieces each chunk covers (units' optimizer slices in partition order) and the layout of
// its buffer: states, then gradients, then parameters, the parts NVMe reads or writes each on a
// host_align_bytes boundary.
void lay_out_chunks(const Shape& sh, std::vector<ScheduleChunk>& chunks) {
  size_t ui = 0;
  double in_unit = 0;
  const double a = sh.z.host_align_bytes;
  for (ScheduleChunk& ch : chunks) {
    double left = ch.params;
    while (left > 0 && ui < sh.units.size()) {
      const double len = opt_len(sh, sh.units[ui]);
      const double take = std::min(left, len - in_unit);
      if (take > 0) ch.pieces.push_back({int(ui), in_unit, take});
      left -= take;
      in_unit += take;
      if (in_unit >= len) ++ui, in_unit = 0;
    }
    if (ot(sh) == Tier::gpu) continue;  // no buffer: the states stay on the GPU
    double bytes = ot(sh) == Tier::nvme ? align_up(sh.z.optim_bytes * ch.params, a) : 0;
    if (sh.pl.grad16.tier == Tier::nvme)
      for (const ChunkPiece& pc : ch.pieces) {
        ch.grad_at.push_back(bytes);
        bytes += align_up(sh.z.param_bytes * pc.count, a);
      }
    if (sh.pl.param16.tier == Tier::nvme)
      for (const ChunkPiece& pc : ch.pieces) {
        ch.param_at.push_back(bytes);
        bytes += align_up(sh.z.param_bytes * pc.count, a);
      }
    ch.layout_bytes = bytes;
  }
}

void emit_read(Builder& b, int k, const std::vector<int>& after) {
  const Shape& sh = b.sh;
  Optim& o = b.opt;
  if (o.per_param <= 0) return;
  std::vector<int> d = after;
  const size_t pos = o.read_order.size();
  if (pos >= 3) d.push_back(o.writes[size_t(o.read_order[pos - 3])]);  // its buffer is free again
  o.read_order.push_back(k);
  std::vector<int>& r = o.reads[size_t(k)];
  // every chunk buffer holds the largest chunk: slots the memory plan rotates
  const int buf = b.e.buffer(BufferKind::chunk, chunk_name(k), Tier::cpu, o.per_param * b.e.schedule().optimizer_chunk_params,
                             -1, k);
  o.bufs[size_t(k)] = buf;
  auto read = [&](State st, double bytes) {
    Step s = transfer({StepKind::fetch, Phase::optimizer, Hop::nc, st, bytes, Tier::nvme, Tier::cpu, LinkClass::nvme_cpu},
                      chunk_name(k), d, -1, buf);
    s.chunk = k;
    r.push_back(b.e.emit(std::move(s)));
  };
  if (ot(sh) == Tier::nvme) read(State::optim32, sh.z.swapped_optim_bytes() * chunk_size(b, k));
  if (sh.pl.grad16.tier == Tier::nvme) read(State::grad16, sh.z.param_bytes * chunk_size(b, k));
  if (!r.empty()) b.e.step(r.front()).allocs.push_back(buf);
  else o.pending_alloc = buf;
}

// Updated 16-bit parameters go back to where param16 lives: to the GPUs when it is resident there
// (each rank copies its partition and the group all-gathers, or the owner broadcasts).
void refresh_params(Builder& b, int after, int k, int also_after = -1) {
  const Shape& sh = b.sh;
  if (sh.pl.param16.tier != Tier::gpu || ot(sh) == Tier::gpu) return;
  const double optim_params = chunk_size(b, k);
  const double whole = sh.z.param_bytes * optim_params * (sh.pl.optim32.partitioned ? sh.dp : 1);
  const double mine = sh.z.param_bytes * optim_params;
  const int staged = b.opt.params16[size_t(k)];
  Step st = transfer({StepKind::fetch, Phase::optimizer, Hop::cg, State::param16, mine, Tier::cpu, Tier::gpu,
                      LinkClass::cpu_gpu},
                     "params", deps({after, also_after}), staged, -1);
  st.chunk = k;
  const int cg = b.e.emit(std::move(st));
  b.e.free_at(cg, staged);
  b.opt.last_refresh = cg;
  if (sh.dp > 1 && !sh.pl.param16.partitioned && sh.pl.optim32.partitioned && !sh.broadcast()) {
    Step g = transfer({StepKind::fetch, Phase::optimizer, Hop::gg, State::param16, whole - mine, Tier::gpu, Tier::gpu,
                       sh.collective_link},
                      "params", deps({cg}));
    g.chunk = k;
    g.collective = {CollectiveKind::all_gather, CommGroup::dp, sh.dp, -1, mine};
    b.e.emit(std::move(g));
  }
}

// Adam on chunk k, then its writes to NVMe and (parameters on the GPU) the copy back, unless dpu
// holds that copy until this iteration's computes are done.
void emit_update(Builder& b, int k, const std::vector<int>& after) {
  const Shape& sh = b.sh;
  Optim& o = b.opt;
  const Tier pt = sh.pl.param16.tier;
  Step st;
  st.kind = StepKind::optimizer;
  st.phase = Phase::optimizer;
  st.name = chunk_name(k);
  st.chunk = k;
  st.params = chunk_size(b, k);
  st.src = st.dst = Tier::cpu;
  st.deps = deps({o.prev_adam, o.norm});  // clipping: the reads may start before the norm is known
  const std::vector<int>& r = o.reads[size_t(k)];
  st.deps.insert(st.deps.end(), r.begin(), r.end());
  if (r.empty()) st.deps.insert(st.deps.end(), after.begin(), after.end());
  const int buf = o.per_param > 0 ? o.bufs[size_t(k)] : -1;
  st.src_buf = st.dst_buf = buf;
  if (o.pending_alloc >= 0) {
    st.allocs.push_back(o.pending_alloc);
    o.pending_alloc = -1;
  }
  if (pt == Tier::gpu) {
    o.params16[size_t(k)] = b.e.buffer(BufferKind::params16, "params16:" + std::to_string(k), Tier::cpu,
                                       sh.z.param_bytes * chunk_size(b, k), -1, k);
    st.allocs.push_back(o.params16[size_t(k)]);
  }
  if (o.grads16 >= 0) st.uses.push_back(o.grads16);
  o.prev_adam = b.e.emit(std::move(st));
  o.adams[size_t(k)] = o.prev_adam;
  o.emitted[size_t(k)] = true;
  if (o.grads16 >= 0 && std::all_of(o.emitted.begin(), o.emitted.end(), [](bool e) { return e; }))
    b.e.free_at(o.prev_adam, o.grads16);
  int w = o.prev_adam;
  auto write = [&](State s, double bytes) {
    Step ws = transfer({StepKind::offload, Phase::optimizer, Hop::cn, s, bytes, Tier::cpu, Tier::nvme, LinkClass::nvme_cpu},
                       chunk_name(k), deps({o.prev_adam}), buf, -1);
    ws.chunk = k;
    return b.e.emit(std::move(ws));
  };
  if (ot(sh) == Tier::nvme) w = write(State::optim32, sh.z.swapped_optim_bytes() * chunk_size(b, k));
  if (pt == Tier::nvme) {
    const int states = w;
    w = write(State::param16, sh.z.param_bytes * chunk_size(b, k));
    if (states != o.prev_adam) b.e.step(w).deps.push_back(states);  // the buffer goes when both are out
  }
  if (buf >= 0) b.e.free_at(w, buf);
  o.writes[size_t(k)] = w;
  if (pt == Tier::gpu && sh.c.optimizer_overlap != OptimizerOverlap::dpu) refresh_params(b, o.prev_adam, k);
}

// The broadcast variant's refresh: every unit from the rank that owns (and updated) it, to every
// rank, in unit order, once this rank's own updates are on its GPU.
void broadcast_params(Builder& b, int after) {
  const Shape& sh = b.sh;
  for (size_t i = 0; i < sh.units.size(); ++i) {
    const ScheduleUnit& u = sh.units[i];
    const double whole = sh.z.param_bytes * u.elems;
    Step st = transfer({StepKind::fetch, Phase::optimizer, Hop::bcast, State::param16, u.root == sh.rank ? 0 : whole,
                        Tier::gpu, Tier::gpu, sh.collective_link},
                       u.name, deps({after}));
    st.unit = int(i);
    st.collective = {CollectiveKind::broadcast, CommGroup::dp, sh.dp, u.root, whole};
    b.e.emit(std::move(st));
  }
}

// Which chunks each unit's elements fall in (the partition order of optimizer_chunks).
void map_units_to_chunks(Builder& b) {
  const Shape& sh = b.sh;
  Optim& o = b.opt;
  const std::vector<ScheduleChunk>& ch = b.e.schedule().optimizer_chunks;
  double at = 0;
  size_t k = 0;
  for (size_t i = 0; i < sh.units.size(); ++i) {
    const double e = opt_len(sh, sh.units[i]);
    if (e <= 0) continue;
    const double end = at + e;
    while (k < ch.size() && ch[k].start + ch[k].params <= at) ++k;
    for (size_t j = k; j < ch.size() && ch[j].start < end; ++j) {
      o.chunks_of[int(i)].push_back(int(j));
      ++o.waiting[j];
    }
    at = end;
  }
}

// The adam step on the GPU over the whole partition, then (ZeRO-2: parameters whole, states
// partitioned) the group gathers the parts each rank updated in place.
void optimizer_on_gpu(Builder& b, const std::vector<int>& all_grads) {
  const Shape& sh = b.sh;
  Step st;
  st.kind = StepKind::optimizer;
  st.phase = Phase::optimizer;
  st.name = "adam";
  st.chunk = 0;
  st.params = b.opt.n;
  st.src = st.dst = Tier::gpu;
  st.deps = all_grads;
  const int id = b.e.emit(std::move(st));
  if (sh.pl.param16.tier == Tier::gpu && !sh.pl.param16.partitioned && sh.pl.optim32.partitioned && sh.dp > 1) {
    if (sh.broadcast()) {
      broadcast_params(b, id);
      return;
    }
    const double mine = sh.z.param_bytes * b.opt.n;
    Step g = transfer({StepKind::fetch, Phase::optimizer, Hop::gg, State::param16, mine * (sh.dp - 1), Tier::gpu,
                       Tier::gpu, sh.collective_link},
                      "params", deps({id}));
    g.chunk = 0;
    g.collective = {CollectiveKind::all_gather, CommGroup::dp, sh.dp, -1, mine};
    b.e.emit(std::move(g));
  }
}

// The chunks in order, three reads ahead. The first three reads wait for `after` (every gradient
// offload: one per unit); a later read waits for the read of the chunk three back, which waited for
// them, and whose buffer it takes anyway. Handing every read the whole list made layers x chunks
// dependencies, a schedule quadratic in layers.
void run_chunks(Builder& b, const std::vector<int>& after) {
  const int n = b.opt.chunks;
  auto read_after = [&](int k) -> const std::vector<int>& {
    const std::vector<int>& back = k >= 3 ? b.opt.reads[size_t(k - 3)] : after;
    return back.empty() ? after : back;
  };
  for (int k = 0; k < std::min(3, n); ++k) emit_read(b, k, after);
  for (int k = 0; k < n; ++k) {
    emit_update(b, k, after);
    if (k + 3 < n) emit_read(b, k + 3, read_after(k + 3));
  }
}

// Gradient clipping: once every gradient is final (`after`), this rank's sum of squares over its
// optimizer partition's gradients, then (the partition spread over dp ranks) every rank's sum to
// every rank, then the slices' sums (mp), then the stages' (pp). The updates wait for the step returned (-1: no clipping). Gradients on NVMe were
// summed as their final values were written (the pinned copy the write reads): nothing to read here.
int gradient_norm(Builder& b, const std::vector<int>& after) {
  const Shape& sh = b.sh;
  if (!(sh.c.grad_clip > 0)) return -1;
  const Tier gt = sh.pl.grad16.tier;
  Step st;
  st.kind = StepKind::grad_norm;
  st.phase = Phase::optimizer;
  st.name = "grad_norm";
  st.state = State::grad16;
  st.src = st.dst = gt == Tier::gpu ? Tier::gpu : Tier::cpu;
  st.bytes = gt == Tier::nvme ? 0 : sh.z.param_bytes * b.opt.n;
  st.deps = after;
  int id = b.e.emit(std::move(st));
  if (sh.dp > 1 && sh.pl.optim32.partitioned) {
    // two fp32 words per rank: the sum split into a float and the float of the rest
    Step x = transfer({StepKind::grad_norm, Phase::optimizer, Hop::gg, State::grad16, 8.0 * (sh.dp - 1), Tier::gpu,
                       Tier::gpu, sh.collective_link},
                      "grad_norm", deps({id}));
    x.collective = {CollectiveKind::all_gather, CommGroup::dp, sh.dp, -1, 8.0};
    id = b.e.emit(std::move(x));
  }
  if (sh.c.mp > 1) {
    // then the tensor slices' sums (each counting a parameter whole on every slice once: on the
    // first), the same two words each
    Step x = transfer({StepKind::grad_norm, Phase::optimizer, Hop::mp, State::grad16, 8.0 * (sh.c.mp - 1), Tier::gpu,
                       Tier::gpu, LinkClass::gpu_gpu},
                      "grad_norm", deps({id}));
    x.collective = {CollectiveKind::all_gather, CommGroup::mp, sh.c.mp, -1, 8.0};
    id = b.e.emit(std::move(x));
  }
  if (sh.pp > 1) {
    // then the stages' sums (each stage holds its own blocks' parameters), over the ranks of this
    // rank's dp rank and slice in every stage: the network where the stages span nodes
    const bool one_node = long(sh.dp) * sh.c.mp * sh.pp <= sh.p.gpus_per_node;
    Step x = transfer({StepKind::grad_norm, Phase::optimizer, Hop::gg, State::grad16, 8.0 * (sh.pp - 1), Tier::gpu,
                       Tier::gpu, one_node ? LinkClass::gpu_gpu : LinkClass::network},
                      "grad_norm", deps({id}));
    x.collective = {CollectiveKind::all_gather, CommGroup::pp, sh.pp, -1, 8.0};
    id = b.e.emit(std::move(x));
  }
  return id;
}

}  // namespace

void plan_optimizer(Builder& b) {
  const Shape& sh = b.sh;
  Optim& o = b.opt;
  Schedule& s = b.e.schedule();
  o.n = kept_param_elems(std::vector<ParamUnit>(sh.units.begin(), sh.units.end()), sh.pl, sh.pl.optim32, sh.dp, sh.rank,
                         sh.c.ep);
  s.optimizer_chunks.clear();
  if (ot(sh) == Tier::gpu) {
    ScheduleChunk one;
    one.start = 0;
    one.params = o.n;
    s.optimizer_chunks = {one};
    s.optimizer_chunk_params = o.n;
    lay_out_chunks(sh, s.optimizer_chunks);
    return;
  }
  o.per_param = optimizer_chunk_bytes_per_param(sh.pl, sh.z);
  for (const OptimizerChunk& c :
       optimizer_chunks(sh.m, sh.pl, sh.c, optimizer_chunk_target(sh.pl, sh.c, sh.p, o.n, sh.z), sh.rank, sh.stage)) {
    ScheduleChunk ch;
    static_cast<OptimizerChunk&>(ch) = c;
    s.optimizer_chunks.push_back(std::move(ch));
  }
  lay_out_chunks(sh, s.optimizer_chunks);
  o.chunks = int(s.optimizer_chunks.size());
  s.optimizer_chunk_params = 0;
  for (const ScheduleChunk& ch : s.optimizer_chunks) s.optimizer_chunk_params = std::max(s.optimizer_chunk_params, ch.params);
  const size_t n = size_t(o.chunks);
  o.reads.assign(n, {});
  o.writes.assign(n, -1);
  o.adams.assign(n, -1);
  o.bufs.assign(n, -1);
  o.params16.assign(n, -1);
  o.emitted.assign(n, false);
  o.waiting.assign(n, 0);
  o.grad_deps.assign(n, {});
  map_units_to_chunks(b);
}

// backward: the gradient of `unit` is final at step `final_step`; a chunk whose units are all
// final is emitted now.
void gradient_final(Builder& b, int unit, int final_step) {
  if (b.sh.c.optimizer_overlap != OptimizerOverlap::backward || ot(b.sh) == Tier::gpu) return;
  auto it = b.opt.chunks_of.find(unit);
  if (it == b.opt.chunks_of.end()) return;  // not in this rank's partition
  for (int k : it->second) {
    b.opt.grad_deps[size_t(k)].push_back(final_step);
    if (--b.opt.waiting[size_t(k)] == 0) {
      emit_read(b, k, b.opt.grad_deps[size_t(k)]);
      emit_update(b, k, b.opt.grad_deps[size_t(k)]);
    }
  }
}

// dpu: the whole update, on the previous iteration's gradients, before this iteration's forward.
void delayed_update(Builder& b) {
  if (b.sh.c.optimizer_overlap != OptimizerOverlap::dpu || ot(b.sh) == Tier::gpu) return;
  run_chunks(b, {});
}

// dpu: a gradient may overwrite its slot on the optimizer's tier once the update that read the
// previous iteration's is done.
std::vector<int> delayed_update_readers(const Builder& b, int unit) {
  std::vector<int> out;
  if (b.sh.c.optimizer_overlap != OptimizerOverlap::dpu) return out;
  auto it = b.opt.chunks_of.find(unit);
  if (it != b.opt.chunks_of.end())
    for (int k : it->second) out.push_back(b.opt.adams[size_t(k)]);
  return out;
}

void optimizer(Builder& b) {
  const Shape& sh = b.sh;
  Optim& o = b.opt;
  std::vector<int> all_grads = b.grads.offloads;
  all_grads.push_back(b.chain.last);
  if (sh.c.grad_clip > 0 && sh.c.optimizer_overlap == OptimizerOverlap::backward)
    throw std::logic_error("gradient clipping with the backward overlap (check_optimizer_overlap refuses it)");
  // dpu: the norm of this iteration's gradients, for the update the next iteration runs
  const int norm = gradient_norm(b, all_grads);
  o.norm = norm;
  if (ot(sh) == Tier::gpu) {
    optimizer_on_gpu(b, norm >= 0 ? std::vector<int>{norm} : all_grads);
    return;
  }
  const Tier pt = sh.pl.param16.tier;
  if (sh.c.optimizer_overlap == OptimizerOverlap::none) {
    // Gradients kept on the GPU go to the CPU that runs the optimizer (ZeRO-Offload, ZeRO-2 + CPU).
    if (sh.pl.grad16.tier == Tier::gpu) {
      o.grads16 = b.e.buffer(BufferKind::grads16, "grads16", Tier::cpu, sh.z.param_bytes * o.n);
      const int id = b.e.emit(transfer({StepKind::offload, Phase::optimizer, Hop::gc, State::grad16,
                                        sh.z.param_bytes * o.n, Tier::gpu, Tier::cpu, LinkClass::cpu_gpu},
                                       "grads", all_grads, -1, o.grads16));
      b.e.step(id).allocs.push_back(o.grads16);
      all_grads = {id};
    }
    run_chunks(b, all_grads);
  } else if (sh.c.optimizer_overlap == OptimizerOverlap::dpu) {
    // the updates ran beside this iteration's computes: their parameters reach the GPU now
    for (int k = 0; k < o.chunks; ++k) refresh_params(b, o.adams[size_t(k)], k, b.chain.last);
  } else {
    for (int k = 0; k < o.chunks; ++k)
      if (!o.emitted[size_t(k)]) throw std::logic_error("optimizer chunk never became ready in backward");
  }
  if (pt == Tier::gpu && !sh.pl.param16.partitioned && sh.pl.optim32.partitioned && sh.broadcast())
    broadcast_params(b, o.last_refresh >= 0 ? o.last_refresh : o.prev_adam);
}

}  // namespace memwall::build
