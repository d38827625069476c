// The backward pass of one micro-step: the head, then per checkpoint segment (the last first) the
// recompute of its blocks followed by their backward, then the embedding, as one item list. Each
// segment loads its checkpoint and holds its activation working memory while it runs. Gradients
// leave as they are made: reduced across the data-parallel group and moved to their tier.
#include "model/analysis.hpp"
#include "model/schedule_build.hpp"

namespace memwall::build {

namespace {

// Bytes this rank receives in a gradient collective that uncompressed receives `bytes` in
// `pieces` pieces (one per peer and pass): 1-bit Adam's compression stage shrinks them.
double grad_collective_bytes(const Shape& sh, double bytes, double pieces) {
  return sh.c.what_if.onebit_adam ? onebit_bytes(bytes, sh.z.param_bytes, pieces) : bytes;
}

// Gradients are final (and the optimizer may read them) only in the last micro-step; partitioned
// or offloaded ones are reduced and moved in every micro-step and accumulate where they land.
bool last_micro_step(const Builder& b) { return b.e.accum < 0 || b.e.accum == b.sh.grad_accum - 1; }
// A micro-step after the first: what it reduces or offloads adds to the earlier micro-steps' sum
// (not the tied embedding's under stages: it collects on the GPU and leaves once, summed).
bool adds_to_earlier(const Builder& b, int unit) {
  return b.e.accum > 0 && !b.sh.collects_across_stages(b.sh.units[size_t(unit)]);
}

// This micro-step's gradient (this rank's `keep` bytes of unit's, in buffer `src` on tier t) added
// into the earlier micro-steps' sum: buffer `dst`, or (-1) the persistent grad16 on t.
int accumulate(Builder& b, int unit, Tier t, int src, int dst, double keep, std::vector<int> after) {
  Step st;
  st.kind = StepKind::accumulate;
  st.phase = Phase::backward;
  st.state = State::grad16;
  st.name = b.sh.units[size_t(unit)].name;
  st.unit = unit;
  st.bytes = keep;
  st.src = st.dst = t;
  st.src_buf = src;
  st.dst_buf = dst;
  st.deps = std::move(after);
  return b.e.emit(std::move(st));
}

// The reduce of a finished gradient across the data-parallel group: a reduce-scatter (or the
// owner's reduce) when grad16 is partitioned, else an all-reduce (in the last micro-step only when
// the gradient accumulates on the GPU). The reduced part lands in grad16's shard on the GPU, or
// stays in the buffer's slice for the offload or a later micro-step's accumulate. Returns the step
// that finishes it (the compute when nothing is reduced) and sets `keep`, the bytes of it that
// stay on this rank.
int reduce_gradient(Builder& b, int unit, int buf, int compute_id, double whole, double& keep) {
  const Shape& sh = b.sh;
  const ScheduleUnit& u = sh.units[size_t(unit)];
  const StatePlacement& gp = sh.pl.grad16;
  const int dp = sh.unit_ranks(u);  // the data-parallel group, or a routed expert's dp / ep ranks
  const CommGroup group = sh.unit_group(u);
  keep = whole;
  if (dp > 1 && gp.partitioned) {
    // reduce-scatters the buffer; this rank's part lands in its grad16 shard when that is on the GPU
    const bool bcast = sh.broadcast();
    const double got = grad_collective_bytes(sh, whole * (dp - 1) / dp, dp - 1);
    Step st = transfer({StepKind::reduce_scatter, Phase::backward, bcast ? Hop::reduce : Hop::rs, State::grad16, got,
                        Tier::gpu, Tier::gpu, sh.collective_link},
                       u.name, deps({compute_id}), buf, gp.tier == Tier::gpu && !adds_to_earlier(b, unit) ? -1 : buf);
    st.unit = unit;
    st.collective = bcast ? CollectiveSpec{CollectiveKind::reduce, CommGroup::dp, dp, u.root, got * dp / (dp - 1)}
                          : CollectiveSpec{CollectiveKind::reduce_scatter, group, dp, -1, got / (dp - 1)};
    keep = bcast ? (u.root == sh.rank ? whole : 0) : whole / dp;
    return b.e.emit(std::move(st));
  }
  if (dp > 1 && (last_micro_step(b) || gp.tier != Tier::gpu)) {
    // whole gradients accumulate in grad16 on the GPU and are all-reduced once, at the last
    // micro-step; ones that leave the GPU (l2l) are all-reduced in every micro-step, as they go
    const double got = grad_collective_bytes(sh, 2.0 * whole * (dp - 1) / dp, 2.0 * (dp - 1));
    Step st = transfer({StepKind::allreduce, Phase::backward, Hop::ar, State::grad16, got, Tier::gpu, Tier::gpu,
                        sh.collective_link},
                       u.name, deps({compute_id}), buf, buf);
    st.unit = unit;
    st.collective = {CollectiveKind::all_reduce, group, dp, -1, got * dp / (2.0 * (dp - 1))};
    return b.e.emit(std::move(st));
  }
  return compute_id;
}

// A gradient (this rank's `keep` bytes of it) leaves the GPU for CPU memory (gc) and, on NVMe,
// the drive (cn). Returns the last step.
int offload_gradient(Builder& b, int unit, int buf, int after, double keep) {
  const Shape& sh = b.sh;
  const ScheduleUnit& u = sh.units[size_t(unit)];
  const bool to_nvme = sh.pl.grad16.tier == Tier::nvme, adds = adds_to_earlier(b, unit);
  // dpu: the slot this gradient overwrites holds the previous iteration's until its update read it
  const std::vector<int> readers = delayed_update_readers(b, unit);
  std::vector<int> gc_deps = deps({after});
  if (!to_nvme) gc_deps.insert(gc_deps.end(), readers.begin(), readers.end());
  // staged in CPU memory on its way to NVMe, or to be added to the earlier micro-steps' sum
  const int staged = to_nvme || adds ? b.e.buffer(BufferKind::staged_grad, "gc:" + u.name, Tier::cpu, keep, unit) : -1;
  Step gc = transfer({StepKind::offload, Phase::backward, Hop::gc, State::grad16, keep, Tier::gpu, Tier::cpu,
                      LinkClass::cpu_gpu},
                     u.name, gc_deps, buf, staged);
  gc.unit = unit;
  if (staged >= 0) gc.allocs.push_back(staged);
  int prev = b.e.emit(std::move(gc));
  b.e.free_at(prev, buf);
  b.grads.offloads.push_back(prev);
  b.grads.done.push_back(prev);
  if (adds && !to_nvme) {  // into the persistent grad16 in CPU memory
    prev = accumulate(b, unit, Tier::cpu, staged, -1, keep, deps({prev}));
    b.e.free_at(prev, staged);
    b.grads.offloads.push_back(prev);
    return prev;
  }
  if (!to_nvme) return prev;
  int out = staged;  // what goes to the drive
  if (adds) {  // the earlier micro-steps' sum back from the drive, this one's added, the sum written back
    const int sum = b.e.buffer(BufferKind::staged_grad, "sum:" + u.name, Tier::cpu, keep, unit);
    Step nc = transfer({StepKind::fetch, Phase::backward, Hop::nc, State::grad16, keep, Tier::nvme, Tier::cpu,
                        LinkClass::nvme_cpu},
                       u.name, deps({b.grads.written.at(unit)}), -1, sum);
    nc.unit = unit;
    nc.allocs.push_back(sum);
    const int read = b.e.emit(std::move(nc));
    prev = accumulate(b, unit, Tier::cpu, staged, sum, keep, deps({prev, read}));
    b.e.free_at(prev, staged);
    out = sum;
  }
  std::vector<int> cn_deps = deps({prev});
  cn_deps.insert(cn_deps.end(), readers.begin(), readers.end());
  Step cn = transfer({StepKind::offload, Phase::backward, Hop::cn, State::grad16, keep, Tier::cpu, Tier::nvme,
                      LinkClass::nvme_cpu},
                     u.name, cn_deps, out, -1);
  cn.unit = unit;
  prev = b.e.emit(std::move(cn));
  b.e.free_at(prev, out);
  b.grads.offloads.push_back(prev);
  b.grads.written[unit] = prev;
  return prev;
}

// The tied embedding's gradient on the first or last stage, summed over every micro-step, added
// to the other stage's copy's (an all-reduce of the two, CommGroup::tied). Returns the step.
int tied_allreduce(Builder& b, int unit, int buf, int after, double whole) {
  const Shape& sh = b.sh;
  Step st = transfer({StepKind::allreduce, Phase::backward, Hop::ar, State::grad16, whole, Tier::gpu, Tier::gpu,
                      sh.tied_link},
                     sh.units[size_t(unit)].name, deps({after}), buf, buf);
  st.unit = unit;
  st.collective = {CollectiveKind::all_reduce, CommGroup::tied, 2, -1, whole};
  return b.e.emit(std::move(st));
}

// A whole gradient (`made`: the step after which it is; `compute_id`: its last backward compute)
// reduced over dp and moved to the gradient tier.
void leave(Builder& b, int unit, int buf, int made, int compute_id, double whole) {
  const Shape& sh = b.sh;
  double keep = 0;
  int prev = reduce_gradient(b, unit, buf, made, whole, keep);
  if (sh.pl.grad16.tier == Tier::gpu || keep <= 0) {  // the persistent grad16 on the GPU holds it, or another rank does
    // a later micro-step's reduced part, in the buffer's slice, added to the earlier ones' in grad16
    if (keep > 0 && buf >= 0 && prev != compute_id && adds_to_earlier(b, unit))
      prev = accumulate(b, unit, Tier::gpu, buf, -1, keep, deps({prev}));
    if (buf >= 0) b.e.free_at(prev, buf);
    b.grads.done.push_back(prev);
    if (prev != compute_id) b.grads.offloads.push_back(prev);  // the optimizer reads the reduced gradient
    return;
  }
  const int last = offload_gradient(b, unit, buf, prev, keep);
  // sync_grad_copies, ZeRO-Offload's owner: the next backward compute waits for this copy to CPU
  // memory. DeepSpeed's stage 2 synchronizes the device before each bucket's reduce (v0.3.x
  // stage2.py average_tensor) and copies on the owner only, so the owners' copies go one rank at a
  // time and the others wait for the owner in the next reduce ("gradient copying to CPU occurs one
  // rank at a time, which slows down backward and under-utilizes PCIe": microsoft/DeepSpeed PR
  // #1067, v0.4.0). The paper's Fig. 8: "limited by single PCIe bandwidth".
  if (sh.broadcast() && sh.c.sync_grad_copies) b.chain.next_deps.push_back(last);
  if (last_micro_step(b)) gradient_final(b, unit, last);
}

// The tied embedding's gradient under stages, once the stage's last backward is done: all-reduced
// with the other stage's copy, then reduced over dp and moved to its tier as any other.
void tied_gradient(Builder& b) {
  if (!b.grads.tied) return;
  const Grads::Tied t = *b.grads.tied;
  b.grads.tied.reset();
  const int made = tied_allreduce(b, t.unit, t.buf, b.chain.last, t.bytes);
  leave(b, t.unit, t.buf, made, t.compute, t.bytes);
}

}  // namespace

// Backward produced the gradient of (a tile of) an operator's parameters. Reduce it across the
// data-parallel group and move this rank's part to the gradient tier once its last use is done
// (the tied embedding collects gradients from lm_head and embed).
void grad_ready(Builder& b, const Item& it, int compute_id) {
  const Shape& sh = b.sh;
  const size_t o = sh.owner[it.v];
  const int unit = sh.unit(it);
  if (it.v != o && sh.computes(o)) return;  // lm_head: the embedding's backward comes later and finishes it
  if (it.u >= 0 && it.u + 1 < sh.micro_batches) return;  // l2l accumulates over micro-batches
  int buf = -1;
  if (auto p = b.grads.pending.find(unit); p != b.grads.pending.end()) {
    buf = p->second;
    b.grads.pending.erase(p);
  }
  if (sh.collects_across_stages(sh.units[size_t(unit)])) {
    if (!last_micro_step(b)) {  // the next micro-step's backward adds to it
      if (buf >= 0) b.grads.pending[unit] = buf;
      return;
    }
    // summed with the other stage's copy after this stage's backward (tied_gradient): nothing of
    // this stage's backward may wait for the other stage's
    b.grads.tied = Grads::Tied{unit, buf, compute_id, sh.param_bytes(it.v)};
    return;
  }
  leave(b, unit, buf, compute_id, compute_id, sh.param_bytes(it.v));
}

namespace {

// The checkpoint of segment `b0` (per micro-batch) back on the GPU for its recompute: loaded from
// CPU memory, and all-gathered whole over the tensor-slicing group when partitioned. Adds the
// buffers to give back when the segment is done to `open`; returns the steps the recompute waits for.
std::vector<int> load_checkpoints(Builder& b, int b0, std::vector<int>& open) {
  const Shape& sh = b.sh;
  const Tier ct = sh.pl.act_ckpt.tier;
  std::vector<int> out;
  for (int u = 0; u < sh.micro_batches; ++u) {
    const int saved = b.ckpts.buf.at(ckpt_key(b, b0, u));
    const std::string cname = checkpoint_name(b, b0, u), name = "block" + std::to_string(b0) + ".input";
    const int loaded =
        ct == Tier::gpu ? saved : b.e.buffer(BufferKind::ckpt_loaded, "ckpt@gpu:" + cname, Tier::gpu, sh.kept_ckpt_bytes());
    // Not prefetched: the checkpoint's buffer is free only once the later segment is done.
    Step st = transfer({StepKind::load_ckpt, Phase::recompute, ct == Tier::gpu ? Hop::none : Hop::cg, State::act_ckpt,
                        sh.kept_ckpt_bytes(), ct, Tier::gpu, link_between(ct, Tier::gpu)},
                       name, deps({b.ckpts.saved.at(ckpt_key(b, b0, u)), b.chain.last}), saved, loaded);
    st.micro_batch = sh.micro_batches > 1 ? u : -1;
    st.block = b0;
    int id = b.e.emit(std::move(st));
    if (ct != Tier::gpu) {
      b.e.step(id).allocs.push_back(loaded);
      open.push_back(loaded);
    }
    open.push_back(saved);
    if (sh.ckpt_gathered()) {  // the other slices' parts, over the mp group, into a whole checkpoint
      const int whole = b.e.buffer(BufferKind::ckpt_whole, "ckpt@mp:" + cname, Tier::gpu, sh.ckpt_bytes());
      Step g = transfer({StepKind::fetch, Phase::recompute, Hop::mp, State::act_ckpt,
                         sh.ckpt_bytes() - sh.kept_ckpt_bytes(), Tier::gpu, Tier::gpu, LinkClass::gpu_gpu},
                        name, deps({id}), loaded, whole);
      g.micro_batch = sh.micro_batches > 1 ? u : -1;
      g.block = b0;
      g.collective = {CollectiveKind::all_gather, CommGroup::mp, sh.c.mp, -1, sh.kept_ckpt_bytes()};
      id = b.e.emit(std::move(g));
      b.e.step(id).allocs.push_back(whole);
      open.push_back(whole);
    }
    out.push_back(id);
  }
  return out;
}

}  // namespace

void backward(Builder& b, int k) {
  const Shape& sh = b.sh;
  const StageBlocks& cb = sh.chunks[size_t(k)];
  Pipe& pipe = b.pipe[size_t(k)];
  std::vector<Item> items;
  if (sh.ends_pipeline(k))
    items = sh.items_of(sh.tail_ops, Phase::backward);
  else
    b.chain.next_deps.push_back(p2p(b, Phase::backward, Hop::recv, k, deps({pipe.backward_done})));
  std::map<size_t, int> segment_start;  // item index -> first block of the segment starting there
  const int ci = sh.c.ci;
  const int segments = (cb.last - cb.first + ci - 1) / ci;
  for (int sgi = segments - 1; sgi >= 0; --sgi) {
    const int b0 = cb.first + sgi * ci, b1 = std::min(cb.last, b0 + ci);
    std::vector<size_t> seg;
    for (int blk = b0; blk < b1; ++blk)
      for (size_t v : sh.block_ops(blk)) seg.push_back(v);
    segment_start[items.size()] = b0;
    // each micro-batch's recompute, then its backward (l2l: micro-batch by micro-batch)
    std::vector<Item> rb = sh.items_of({{&seg, Phase::recompute}, {&seg, Phase::backward}});
    items.insert(items.end(), rb.begin(), rb.end());
  }
  const size_t head_at = items.size();
  if (sh.starts_pipeline(k)) {
    std::vector<Item> head = sh.items_of(sh.head_ops, Phase::backward);
    items.insert(items.end(), head.begin(), head.end());
  }
  std::vector<int> open;  // buffers of the open segment, given back when it is done
  auto close_segment = [&]() {
    for (int buf : open) b.e.free_at(b.chain.last, buf);
    open.clear();
  };
  run_items(b, items, [&](size_t i) {
    if (i == head_at) close_segment();
    auto it = segment_start.find(i);
    if (it == segment_start.end()) return;
    close_segment();
    const int b0 = it->second;
    const std::vector<int> loads = load_checkpoints(b, b0, open);
    b.chain.next_deps.insert(b.chain.next_deps.end(), loads.begin(), loads.end());
    const double awm = block_activation_bytes(sh) * std::min(ci, cb.last - b0);  // one micro-batch's at a time
    if (awm > 0) {
      const int buf = b.e.buffer(BufferKind::awm, "awm:segment" + std::to_string(b0), Tier::gpu, awm);
      b.chain.next_allocs.push_back(buf);
      open.push_back(buf);
    }
  });
  close_segment();
  pipe.backward_done = b.chain.last;
  if (!sh.starts_pipeline(k)) {
    if (pipe.backward_sent >= 0) b.e.step(b.chain.last).deps.push_back(pipe.backward_sent);
    pipe.backward_sent = p2p(b, Phase::backward, Hop::send, k, deps({b.chain.last}));
  }
  // the stage's last backward is its first chunk's last micro-step
  if (last_micro_step(b) && k == 0) tied_gradient(b);
}

}  // namespace memwall::build
