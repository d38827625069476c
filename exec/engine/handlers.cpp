#include "exec/engine/handlers.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include "exec/backend/half.hpp"

namespace memwall::exec {
namespace {

Token on_stream(EngineContext& e, Stream s) {
  Token t;
  t.kind = Token::event;
  t.ev = e.take_event();
  e.k().event_record(e.cx(), t.ev, s);
  return t;
}

Token io_token(io::IoHandle h) {
  Token t;
  t.kind = Token::io;
  t.handle = std::move(h);
  return t;
}

Result<Token> io_token(Result<io::IoHandle> h) {
  if (!h) return make_error(h.error());
  return io_token(std::move(h).value());
}

Token collective_token(std::vector<std::unique_ptr<CollectiveOp>> ops) {
  Token t;
  t.kind = Token::collective;
  t.ops = std::move(ops);
  return t;
}

Result<Token> collective_token(Result<std::unique_ptr<CollectiveOp>> op) {
  if (!op) return make_error(op.error());
  std::vector<std::unique_ptr<CollectiveOp>> ops;
  ops.push_back(std::move(op).value());
  return collective_token(std::move(ops));
}

const UnitLayout& unit_of(const EngineContext& e, const Step& s) { return e.tiers.units()[size_t(s.unit)]; }
const ChunkLayout& chunk_of(const EngineContext& e, const Step& s) { return e.tiers.chunks()[size_t(s.chunk)]; }
std::size_t psz(const EngineContext& e) { return e.tiers.elem_bytes(); }

// What a transfer reads: its source buffer, or this rank's part of the persistent state.
char* src_or_state(EngineContext& e, const Step& s, State st, const UnitLayout& u) {
  return s.src_buf >= 0 ? e.buffer(s.src_buf) : e.tiers.unit_in(st, u);
}

// The buffer of kind `kind` a step makes or uses (the optimizer's staged gradients and parameters).
char* named(EngineContext& e, const Step& s, BufferKind kind) {
  for (const std::vector<int>* ids : {&s.allocs, &s.uses})
    for (int b : *ids)
      if (e.sched->buffers[size_t(b)].kind == kind) return e.buffer(b);
  return nullptr;
}

Result<Token> unsupported(const char* what) { return make_error(std::string(what) + " is planned and simulated, not executed"); }

// One request per piece of an optimizer chunk: the piece's elements of its unit's slot in `state`'s
// swap file, at `at[i]` bytes into the chunk buffer.
std::vector<io::IoRequest> piece_requests(EngineContext& e, const ChunkLayout& ch, State state, io::IoOp op, char* buf,
                                          const std::vector<std::size_t>& at) {
  io::SwapFile& sw = e.tiers.swap(state);
  std::vector<io::IoRequest> rq;
  for (std::size_t i = 0; i < ch.pieces.size(); ++i) {
    const PieceLayout& pc = ch.pieces[i];
    rq.push_back({op, sw.file(), sw.shard(pc.unit).offset + pc.from * psz(e), buf + at[i], io::align_up(pc.count * psz(e))});
  }
  return rq;
}

// ---- fetch: nc (NVMe -> pinned), cg (pinned or CPU state -> device), gg / bcast (collectives) ----

// gg: every rank's shard of a unit into its whole buffer (zero3: this rank's from its shard on
// the device); "params" after the optimizer: every rank's updated part of every unit of the chunk
// into the whole param16 on the device; bcast: the owner's copy of a unit to every rank.
Result<Token> gather(EngineContext& e, const Step& s) {
  if (s.hop == Hop::mp) {  // a partitioned checkpoint's slices, over the mp group, into the whole one
    if (!e.mp_coll) return make_error("internal error: a checkpoint all-gather without the tensor-slicing group");
    const std::size_t count = std::size_t(s.collective.bytes_per_rank) / sizeof(float);  // fp32 activations
    char* whole = e.buffer(s.dst_buf);
    e.gpt->set_segment_input(std::max(0, s.micro_batch), reinterpret_cast<const float*>(whole));
    return collective_token(e.mp_coll->all_gather(whole, count, count, adam::DType::fp32, e.buffer(s.src_buf)));
  }
  Tiers& t = e.tiers;
  const adam::DType dt = e.o.precision;
  if (s.hop == Hop::bcast) {
    const UnitLayout& u = unit_of(e, s);
    char* dst = s.phase == Phase::optimizer ? t.unit_in(State::param16, u) : e.buffer(s.dst_buf);
    return collective_token(e.coll->broadcast(dst, u.elems, dt, s.collective.root));
  }
  if (s.phase == Phase::optimizer) {
    std::vector<std::unique_ptr<CollectiveOp>> ops;
    for (const PieceLayout& pc : chunk_of(e, s).pieces) {
      const UnitLayout& u = t.units()[pc.unit];
      Result<std::unique_ptr<CollectiveOp>> op =
          e.coll->all_gather(t.state_ptr(State::param16) + (u.whole_at + pc.from) * psz(e), pc.count, u.shard, dt);
      if (!op) return make_error(op.error());
      ops.push_back(std::move(op).value());
    }
    return collective_token(std::move(ops));
  }
  const UnitLayout& u = unit_of(e, s);
  const void* send = s.src_buf < 0 ? t.unit_in(State::param16, u) : nullptr;
  return collective_token(e.coll->all_gather(e.buffer(s.dst_buf), u.shard, u.shard, dt, send));
}

// The optimizer's reads (a chunk's states and gradients from NVMe into its buffer) and the updated
// parameters' copy back to the device, piece by piece.
Result<Token> fetch_optimizer(EngineContext& e, const Step& s) {
  Tiers& t = e.tiers;
  const ChunkLayout& ch = chunk_of(e, s);
  if (s.hop == Hop::cg) {
    const char* src = e.buffer(s.src_buf);
    std::size_t at = 0;
    for (const PieceLayout& pc : ch.pieces) {
      e.k().copy_h2d_async(e.cx(), e.h2d, t.slice_in(State::param16, t.units()[pc.unit], pc.from), src + at * psz(e),
                           pc.count * psz(e));
      at += pc.count;
    }
    return on_stream(e, e.h2d);
  }
  char* buf = e.buffer(s.dst_buf);
  if (s.state == State::optim32) return io_token(t.swap(State::optim32).read(size_t(s.chunk), buf));
  // gradients of the chunk's pieces, each from its unit's slot
  return io_token(t.io()->submit(piece_requests(e, ch, State::grad16, io::IoOp::read, buf, ch.grad_at)));
}

Result<Token> fetch(EngineContext& e, const Step& s) {
  if (is_collective(s)) return gather(e, s);
  if (s.phase == Phase::optimizer) return fetch_optimizer(e, s);
  const UnitLayout& u = unit_of(e, s);
  char* dst = e.buffer(s.dst_buf);
  // parameters on their way to the device, or (gradient accumulation) the earlier micro-steps' sum
  if (s.hop == Hop::nc) return io_token(e.tiers.swap(*s.state).read(size_t(s.unit), dst));
  // cg: this rank's part goes where the gather will expect it in the whole buffer
  const bool part = e.tiers.sharded(State::param16);
  const std::size_t count = part ? u.len : u.elems;
  e.k().copy_h2d_async(e.cx(), e.h2d, dst + (part ? u.from * psz(e) : 0), src_or_state(e, s, State::param16, u),
                       count * psz(e));
  return on_stream(e, e.h2d);
}

// ---- compute: one GPT operator (or one tile of it), on the compute stream ----

Result<Token> compute(EngineContext& e, const Step& s) {
  const ScheduleOp& op = e.sched->ops[size_t(s.op)];
  OpCall c;
  c.op = OpRef{op.role, op.block};
  c.tile = s.tile;
  c.tiles = s.tile >= 0 ? e.o.config.tiling_factor : 1;
  c.micro_batch = std::max(0, s.micro_batch);
  c.recompute = s.phase == Phase::recompute;
  const bool backward = s.phase == Phase::backward;
  const bool mixed = e.o.precision != adam::DType::fp32;
  std::size_t elems = 0;
  char* grad_target = nullptr;
  if (s.unit >= 0) {
    const UnitLayout& u = unit_of(e, s);
    elems = u.elems;
    // the whole unit: fetched into a buffer, or resident whole (at dp 1 a shard is the whole)
    char* w = src_or_state(e, s, State::param16, u);
    if (mixed) {
      e.k().to_fp32(e.cx(), e.gpt->weight_staging(), w, e.o.precision, long(elems));
      c.params = e.gpt->weight_staging();
    } else {
      c.params = reinterpret_cast<const float*>(w);
    }
    if (backward) {
      grad_target = s.dst_buf >= 0 ? e.buffer(s.dst_buf) : e.tiers.unit_in(State::grad16, u);
      if (mixed) {
        e.k().memset_zero(e.cx(), e.gpt->grad_staging(), elems * 4);
        c.grads = e.gpt->grad_staging();
      } else {
        c.grads = reinterpret_cast<float*>(grad_target);
      }
    }
  }
  // the micro-batch this compute works on: its place in the iteration's batch
  const std::size_t per_mb = std::size_t(e.o.config.bsz) * std::size_t(e.o.model.max_seq);
  const std::size_t at = (std::size_t(std::max(0, s.accum_step)) * std::size_t(e.sched->micro_batches) +
                          std::size_t(c.micro_batch)) * per_mb;
  const bool fresh_forward = s.phase == Phase::forward;
  // this micro-step's tokens (the embedding's forward, and its backward: a pipeline's first stage
  // runs later micro-steps' forwards in between) and targets (the head's forward, on the last stage)
  if (op.role == OpRole::embed && (fresh_forward || backward))
    e.k().copy_h2d_async(e.cx(), 0, e.gpt->tokens(c.micro_batch), e.batch_tokens + at, per_mb * sizeof(int));
  if (fresh_forward && op.role == OpRole::lm_head)
    e.k().copy_h2d_async(e.cx(), 0, e.gpt->targets(c.micro_batch), e.batch_targets + at, per_mb * sizeof(int));
  // a chunk's backward starts from the next chunk's input gradient (the stage after's) and ends with
  // its own, but for the pipeline's last and first block
  const int chunk = op.block >= 0 ? e.gpt->chunk_of(op.block) : 0;
  const StageBlocks cb = op.block >= 0 ? e.gpt->chunks()[std::size_t(chunk)] : StageBlocks{};
  if (backward && e.pp > 1 && op.role == OpRole::residual2 && op.block == cb.last - 1 &&
      op.block != e.o.model.layers - 1)
    e.gpt->take_stage_grad(c.micro_batch, chunk);
  if (backward) e.gpt->backward(c);
  else e.gpt->forward(c);
  if (backward && e.pp > 1 && op.role == OpRole::ln1 && op.block == cb.first && op.block > 0)
    e.gpt->give_stage_grad(c.micro_batch, chunk);
  if (fresh_forward && op.role == OpRole::lm_head)  // its losses, before a later micro-step overwrites them
    e.k().copy_d2h_async(e.cx(), 0, e.step_losses.data() + at, e.gpt->losses(c.micro_batch), per_mb * sizeof(float));
  if (backward && mixed && grad_target)
    e.k().accumulate_to(e.cx(), grad_target, e.gpt->grad_staging(), e.o.precision, long(elems));
  return on_stream(e, 0);
}

// ---- reduce_scatter / allreduce: the gradient collectives ----

// rs: a gradient buffer summed over ranks, this rank's shard to its grad16 on the device or left in
// the buffer's own slice for the offload; reduce (broadcast variant): the sum lands on the owner;
// ar: summed in place (whole gradients, data_parallel).
Result<Token> reduce(EngineContext& e, const Step& s) {
  if (s.hop == Hop::mp) {  // Megatron's: the slices' partial sums of (B, T, C) activations, fp32
    if (!e.mp_coll || s.op < 0) return make_error("internal error: a tensor-slicing all-reduce without its group or operator");
    const ScheduleOp& op = e.sched->ops[size_t(s.op)];
    float* buf = e.gpt->mp_partial_sums(op.role, op.block, s.phase == Phase::backward, std::max(0, s.micro_batch));
    return collective_token(e.mp_coll->all_reduce(buf, e.gpt->stream_elems(), adam::DType::fp32));
  }
  const UnitLayout& u = unit_of(e, s);
  char* buf = src_or_state(e, s, State::grad16, u);
  const adam::DType dt = e.o.precision;
  if (s.collective.kind == CollectiveKind::reduce) return collective_token(e.coll->reduce(buf, u.elems, dt, s.collective.root));
  if (s.collective.group == CommGroup::tied) {  // the tied embedding's two copies, first and last stage
    if (!e.tied_coll) return make_error("internal error: a tied embedding's all-reduce without the tied group");
    return collective_token(e.tied_coll->all_reduce(buf, u.elems, dt));
  }
  if (s.collective.kind == CollectiveKind::all_reduce) return collective_token(e.coll->all_reduce(buf, u.elems, dt));
  char* out = s.dst_buf < 0 ? e.tiers.unit_in(State::grad16, u) : buf + std::size_t(e.rank) * u.shard * psz(e);
  return collective_token(e.coll->reduce_scatter(buf, out, u.shard, dt));
}

// ---- offload: a gradient leaving the device (gc) and then the drive (cn); the optimizer's
// writes of a chunk's states and parameters; every gradient to CPU memory for CPU Adam ----

Result<Token> offload_optimizer(EngineContext& e, const Step& s) {
  Tiers& t = e.tiers;
  if (s.state == State::grad16) {  // this rank's gradients to CPU memory, for CPU Adam: its optimizer slices
    char* dst = e.buffer(s.dst_buf);
    for (const UnitLayout& u : t.units())
      e.k().copy_d2h_async(e.cx(), e.d2h, dst + t.opt_at(u) * psz(e), t.slice_in(State::grad16, u, 0), t.opt_len(u) * psz(e));
    return on_stream(e, e.d2h);
  }
  char* buf = e.buffer(s.src_buf);
  if (s.state == State::optim32) return io_token(t.swap(State::optim32).write(size_t(s.chunk), buf));
  const ChunkLayout& ch = chunk_of(e, s);  // the updated parameters of its pieces, each to its unit's slot
  return io_token(t.io()->submit(piece_requests(e, ch, State::param16, io::IoOp::write, buf, ch.param_at)));
}

// Gradient clipping under tensor slicing counts a replicated parameter once: on mp rank 0. The
// part of unit u's optimizer slice the norm counts on this rank, as (offset, count) into the slice:
// all of it; nothing of a norm's or the embedding's (whole on every slice) elsewhere; and of proj's
// and fc2's tiles only their weight rows (a tile is [W_t, b_t], the bias whole on every slice).
// A tied embedding's copy on a pipeline's last stage is counted on the first stage only.
std::pair<std::size_t, std::size_t> counted_for_norm(const EngineContext& e, const UnitLayout& u) {
  const Tiers& t = e.tiers;
  const std::size_t at = t.sharded(State::optim32) ? u.from : 0, len = t.opt_len(u);
  const ParamGroup& g = t.groups()[u.group];
  if (e.pp > 1 && e.stage == e.pp - 1 && e.o.model.tied_embeddings && g.name == "embed") return {0, 0};
  if (e.mp_rank == 0) return {0, len};
  if (!g.linear) return {0, 0};
  if (!g.row_parallel) return {0, len};
  const std::size_t tiles = std::size_t(std::max(1, u.tile >= 0 ? e.o.config.tiling_factor : 1));
  const std::size_t weights = std::size_t(g.out_features) / tiles * std::size_t(g.in_features);
  const std::size_t to = std::min(at + len, weights);
  return to > at ? std::pair{std::size_t(0), to - at} : std::pair<std::size_t, std::size_t>{0, 0};
}

// Gradient clipping with gradients on NVMe: the sum of squares of a unit's final gradient (the last
// micro-step's write), from the pinned copy the write has just read, on the host lane. Its slot
// holds this rank's optimizer slice, as the optimizer will read it back.
Result<Token> sum_written_gradient(EngineContext& e, const Step& s, const char* src) {
  Token t;
  t.kind = Token::host;
  const std::size_t unit = std::size_t(s.unit);
  const std::pair<std::size_t, std::size_t> counted = counted_for_norm(e, unit_of(e, s));
  const std::size_t n = counted.second;  // (not a structured binding: clang 14 cannot capture one)
  const adam::DType dt = e.o.precision;
  const char* from = src + counted.first * psz(e);
  t.task = e.lane->post([&e, unit, from, n, dt]() -> std::string {
    e.norm.units[unit] = host_sum_squares(from, dt, n);
    return "";
  });
  return t;
}

Result<Token> offload(EngineContext& e, const Step& s) {
  if (s.phase == Phase::optimizer) return offload_optimizer(e, s);
  const UnitLayout& u = unit_of(e, s);
  char* src = e.buffer(s.src_buf);
  if (s.hop == Hop::cn) {
    Result<io::IoHandle> h = e.tiers.swap(State::grad16).write(size_t(s.unit), src);
    if (!h) return make_error(h.error());
    Token w = io_token(std::move(h).value());
    const bool final = s.accum_step < 0 || s.accum_step == e.sched->grad_accum - 1;
    if (final && e.o.config.grad_clip > 0) w.then = [&e, &s, src] { return sum_written_gradient(e, s, src); };
    return w;
  }
  char* dst = s.dst_buf >= 0 ? e.buffer(s.dst_buf) : e.tiers.unit_in(State::grad16, u);
  // after a reduce-scatter this rank's shard sits in its slice of the buffer
  const bool part = e.tiers.sharded(State::grad16);
  const std::size_t count = part ? u.len : u.elems;
  e.k().copy_d2h_async(e.cx(), e.d2h, dst, src + (part ? u.from * psz(e) : 0), count * psz(e));
  return on_stream(e, e.d2h);
}

// ---- checkpoints ----

Result<Token> save_ckpt(EngineContext& e, const Step& s) {
  char* dst = e.buffer(s.dst_buf);
  const std::size_t bytes = std::size_t(s.bytes);
  // partitioned across the mp slices (each holds the whole input): this slice keeps its 1/mp
  const bool partitioned = e.o.placement.act_ckpt.partitioned && e.mp > 1;
  const float* src = e.gpt->block_input(s.block, std::max(0, s.micro_batch)) +
                     (partitioned ? std::size_t(e.mp_rank) * (bytes / sizeof(float)) : 0);
  // the copy reads what the compute stream wrote: it waits for it
  Event ready = e.take_event();
  e.k().event_record(e.cx(), ready, 0);
  e.k().stream_wait_event(e.cx(), e.d2h, ready);
  e.event_pool.push_back(ready);
  if (s.dst == Tier::gpu) e.k().copy_d2d_async(e.cx(), e.d2h, dst, src, bytes);
  else e.k().copy_d2h_async(e.cx(), e.d2h, dst, src, bytes);
  return on_stream(e, e.d2h);
}

Result<Token> load_ckpt(EngineContext& e, const Step& s) {
  const char* src = e.buffer(s.src_buf);
  const int u = std::max(0, s.micro_batch);
  if (s.src == Tier::gpu) {
    e.gpt->set_segment_input(u, reinterpret_cast<const float*>(src));
    return Token{};
  }
  char* dst = e.buffer(s.dst_buf);
  e.k().copy_h2d_async(e.cx(), e.h2d, dst, src, std::size_t(s.bytes));
  e.gpt->set_segment_input(u, reinterpret_cast<const float*>(dst));
  return on_stream(e, e.h2d);
}

// ---- optimizer ----

void keep_gradients(EngineContext& e, const void* g, std::size_t at, std::size_t count) {
  if (e.o.precision == adam::DType::fp32) {
    std::memcpy(e.grads_kept.data() + at, g, count * 4);
    return;
  }
  // widened exactly: every 16-bit value is an fp32 value
  auto* src = static_cast<const std::uint16_t*>(g);
  for (std::size_t i = 0; i < count; ++i) e.grads_kept[at + i] = half::f32_from_half(src[i], e.o.precision);
}

// CPU Adam over one chunk, piece by piece (a piece's gradient and 16-bit copy may sit in their own
// aligned slots of the chunk buffer, or in a state laid out whole). Runs on the host lane.
// `skip`: dpu's first delayed iteration has no pending gradients; its updates only copy the
// parameters (rounded from the masters) for the refresh to bring to the device.
std::string update_chunk(EngineContext& e, const ChunkLayout& ch, char* buf, char* staged_params, char* staged_grads,
                         long step, bool skip, double clip_coef) {
  Tiers& t = e.tiers;
  const Tier ot = t.tier(State::optim32), gt = t.tier(State::grad16), pt = t.tier(State::param16);
  const std::size_t n_opt = t.elems_of(State::optim32), ps = psz(e);
  float* base = reinterpret_cast<float*>(t.state_ptr(State::optim32));
  float* master = ot == Tier::nvme ? reinterpret_cast<float*>(buf) : base + ch.start;
  float* m = ot == Tier::nvme ? master + ch.count : base + n_opt + ch.start;
  float* v = ot == Tier::nvme ? master + 2 * ch.count : base + 2 * n_opt + ch.start;
  std::size_t done = 0;
  for (std::size_t i = 0; i < ch.pieces.size(); ++i) {
    const PieceLayout& pc = ch.pieces[i];
    const UnitLayout& u = t.units()[pc.unit];
    const char* g = gt == Tier::nvme  ? buf + ch.grad_at[i]
                    : gt == Tier::cpu ? t.slice_in(State::grad16, u, pc.from)
                                      : staged_grads + (ch.start + done) * ps;
    char* p16 = pt == Tier::nvme  ? buf + ch.param_at[i]
                : pt == Tier::cpu ? t.slice_in(State::param16, u, pc.from)
                                  : staged_params + done * ps;
    adam::AdamChunk a;
    a.param = master + done;
    a.exp_avg = m + done;
    a.exp_avg_sq = v + done;
    a.grad = g;
    a.grad_dtype = e.o.precision;
    a.param16 = e.o.precision == adam::DType::fp32 ? nullptr : p16;
    a.param16_dtype = e.o.precision;
    a.n = pc.count;
    if (skip) {
      if (e.o.precision == adam::DType::fp32) std::memcpy(p16, a.param, pc.count * 4);
      else if (Result<std::size_t> r = e.adam->convert(a.param, p16, e.o.precision, pc.count); !r) return "adam: " + r.error();
    } else {
      if (e.o.keep_gradients) keep_gradients(e, g, ch.start + done, pc.count);
      Result<std::size_t> r = e.adam->step(a, step, adam::GradScaling{1.0, clip_coef}, adam::lr_at(e.o.lr_schedule, e.o.lr, step));
      if (!r) return "adam: " + r.error();
      if (e.o.precision == adam::DType::fp32) std::memcpy(p16, a.param, pc.count * 4);
    }
    done += pc.count;
    e.lane->report_progress();
  }
  return "";
}

// Adam on the device over this rank's optimizer slices, unit by unit (param16 may be laid out
// whole while the states are partitioned), in order on the compute stream; with keep_gradients
// the gradients are first copied off the device on the same stream and widened once they arrive.
Result<Token> optimizer_on_device(EngineContext& e) {
  if (!e.k().adam_update) return make_error("the " + e.be->caps().name + " backend has no device Adam");
  Tiers& t = e.tiers;
  const std::size_t n_opt = t.elems_of(State::optim32), ps = psz(e);
  float* master = reinterpret_cast<float*>(t.state_ptr(State::optim32));
  auto kept = std::make_shared<std::vector<char>>();
  if (e.o.keep_gradients) {
    kept->resize(n_opt * ps);
    for (const UnitLayout& u : t.units())
      e.k().copy_d2h_async(e.cx(), 0, kept->data() + t.opt_at(u) * ps, t.slice_in(State::grad16, u, 0), t.opt_len(u) * ps);
  }
  for (const UnitLayout& u : t.units()) {
    DeviceAdam a;
    a.param = master + t.opt_at(u);
    a.exp_avg = master + n_opt + t.opt_at(u);
    a.exp_avg_sq = master + 2 * n_opt + t.opt_at(u);
    a.grad = t.slice_in(State::grad16, u, 0);
    a.grad_type = e.o.precision;
    a.param16 = e.o.precision == adam::DType::fp32 ? nullptr : t.slice_in(State::param16, u, 0);
    a.param16_type = e.o.precision;
    a.n = t.opt_len(u);
    a.step = e.adam_step;
    a.lr = adam::lr_at(e.o.lr_schedule, e.o.lr, e.adam_step);
    a.beta1 = e.o.beta1;
    a.beta2 = e.o.beta2;
    a.eps = e.o.eps;
    a.weight_decay = e.o.weight_decay;
    a.decoupled_weight_decay = true;
    a.clip_coef = e.norm.clip_coef;
    e.k().adam_update(e.cx(), a);
    if (e.o.precision == adam::DType::fp32)
      e.k().copy_d2d_async(e.cx(), 0, t.slice_in(State::param16, u, 0), a.param, t.opt_len(u) * 4);
  }
  Token tok = on_stream(e, 0);
  if (e.o.keep_gradients)
    tok.then = [&e, kept]() -> Result<Token> {
      keep_gradients(e, kept->data(), 0, e.tiers.elems_of(State::optim32));
      return Token{};
    };
  return tok;
}

Result<Token> optimizer(EngineContext& e, const Step& s) {
  if (s.src == Tier::gpu) return optimizer_on_device(e);
  const ChunkLayout& ch = chunk_of(e, s);
  char* buf = s.src_buf >= 0 ? e.buffer(s.src_buf) : nullptr;
  char* staged_params = named(e, s, BufferKind::params16);  // param16 on the device: the update goes here first
  char* staged_grads = named(e, s, BufferKind::grads16);
  if (e.tier(State::param16) == Tier::gpu && !staged_params)
    return make_error("internal error: the update names no buffer for its parameters");
  if (e.tier(State::grad16) == Tier::gpu && !staged_grads)
    return make_error("internal error: the update names no buffer for its gradients");
  const long step = e.adam_step;
  const bool skip = e.skip_update;
  const double clip_coef = e.norm.clip_coef;  // dpu: of the gradients this update applies
  Token t;
  t.kind = Token::host;
  t.task = e.lane->post([&e, &ch, buf, staged_params, staged_grads, step, skip, clip_coef]() -> std::string {
    return update_chunk(e, ch, buf, staged_params, staged_grads, step, skip, clip_coef);
  });
  return t;
}

// ---- grad_norm: gradient clipping's global norm ----

// torch.nn.utils.clip_grad_norm_'s coefficient from the global sum of squares: max_norm /
// (total_norm + 1e-6), clamped at 1, in fp32 as torch forms it from its fp32 norm.
void set_global_norm(EngineContext& e, double sum_squares) {
  e.norm.global = std::sqrt(sum_squares);
  const float coef = float(e.o.config.grad_clip) / (float(e.norm.global) + 1e-6f);
  e.norm.clip_coef = std::min(1.0f, coef);
}

// This rank's sum, and the norm as far as it is known: each exchange the schedule has (over dp,
// then over mp) replaces both with its group's sum, and the last one's is the global norm.
void set_mine(EngineContext& e, double sum_squares) {
  e.norm.mine = sum_squares;
  set_global_norm(e, sum_squares);
}

// Gradients on the device: sum_squares per unit slice into the staging, each unit's parts copied
// back behind it on the compute stream, added in unit order once they are here.
Result<Token> norm_on_device(EngineContext& e) {
  if (!e.k().sum_squares) return make_error("the " + e.be->caps().name + " backend has no sum_squares");
  Tiers& t = e.tiers;
  const int parts = e.norm.parts;
  auto* scratch = reinterpret_cast<double*>(e.gpt->grad_staging());
  e.norm.partials.assign(t.units().size() * std::size_t(parts), 0.0);
  for (std::size_t i = 0; i < t.units().size(); ++i) {
    const UnitLayout& u = t.units()[i];
    const auto [off, n] = counted_for_norm(e, u);
    if (n == 0) continue;
    e.k().sum_squares(e.cx(), scratch, parts, t.slice_in(State::grad16, u, off), e.o.precision, long(n));
    e.k().copy_d2h_async(e.cx(), 0, e.norm.partials.data() + i * std::size_t(parts), scratch, std::size_t(parts) * sizeof(double));
  }
  Token tok = on_stream(e, 0);
  tok.then = [&e]() -> Result<Token> {
    double sum = 0;
    for (double p : e.norm.partials) sum += p;
    set_mine(e, sum);
    return Token{};
  };
  return tok;
}

// Every rank's sum to every rank of the step's group (dp, then mp, then pp) as two fp32 words (over
// MPI in host memory, also beside NCCL), each adding them in rank order: every rank gets the same bits.
Result<Token> exchange_norms(EngineContext& e, const Step& s) {
  Collectives* c = nullptr;
  std::size_t ranks = 0;
  switch (s.collective.group) {
    case CommGroup::mp: c = e.mp_boot ? e.mp_boot.get() : e.mp_coll.get(), ranks = std::size_t(e.mp); break;
    case CommGroup::pp: c = e.pp_boot ? e.pp_boot.get() : e.pp_coll.get(), ranks = std::size_t(e.pp); break;
    default: c = e.boot ? e.boot.get() : e.coll.get(), ranks = std::size_t(e.dp); break;
  }
  if (!c) return make_error("internal error: a gradient-norm exchange without its group");
  const float hi = float(e.norm.mine);
  e.norm.words = {hi, float(e.norm.mine - double(hi))};
  e.norm.all.assign(2 * ranks, 0.0f);
  Result<Token> tok = collective_token(c->all_gather(e.norm.all.data(), 2, 2, adam::DType::fp32, e.norm.words.data()));
  if (!tok) return tok;
  Token t = std::move(tok).value();
  t.then = [&e, ranks]() -> Result<Token> {
    double sum = 0;
    for (std::size_t r = 0; r < ranks; ++r) sum += double(e.norm.all[2 * r]) + double(e.norm.all[2 * r + 1]);
    set_mine(e, sum);
    return Token{};
  };
  return t;
}

Result<Token> grad_norm(EngineContext& e, const Step& s) {
  if (is_collective(s)) return exchange_norms(e, s);
  switch (e.tier(State::grad16)) {
    case Tier::gpu: return norm_on_device(e);
    case Tier::nvme: {  // summed unit by unit as they were written
      double sum = 0;
      for (double u : e.norm.units) sum += u;
      set_mine(e, sum);
      return Token{};
    }
    case Tier::cpu: break;
  }
  Token t;
  t.kind = Token::host;
  t.task = e.lane->post([&e]() -> std::string {
    Tiers& tiers = e.tiers;
    double sum = 0;
    for (const UnitLayout& u : tiers.units()) {
      const auto [off, n] = counted_for_norm(e, u);
      sum += host_sum_squares(tiers.slice_in(State::grad16, u, off), e.o.precision, n);
    }
    set_mine(e, sum);
    return "";
  });
  return t;
}

// ---- accumulate: a later micro-step's gradient added to the earlier ones' sum ----

// dst += src over n elements of type t in CPU memory, rounded once per element as the device's
// accumulate_to rounds a backward's gradient (the same bits on every backend).
void add_on_host(char* dst, const char* src, adam::DType t, std::size_t n) {
  if (t == adam::DType::fp32) {
    auto* d = reinterpret_cast<float*>(dst);
    const auto* a = reinterpret_cast<const float*>(src);
    for (std::size_t i = 0; i < n; ++i) d[i] = half::add_f32(d[i], a[i]);
    return;
  }
  auto* d = reinterpret_cast<std::uint16_t*>(dst);
  const auto* a = reinterpret_cast<const std::uint16_t*>(src);
  for (std::size_t i = 0; i < n; ++i)
    d[i] = half::half_from_f32(half::add_f32(half::f32_from_half(d[i], t), half::f32_from_half(a[i], t)), t);
}

// This rank's part of the unit's gradient: in HBM (the reduce-scatter left it in the buffer's
// slice) on the compute stream, widened through the fp32 staging; in CPU memory (staged by the
// offload) on the host lane, as DeepSpeed's offload adds a micro-step's partition on the CPU.
Result<Token> accumulate(EngineContext& e, const Step& s) {
  const UnitLayout& u = unit_of(e, s);
  const bool part = e.tiers.sharded(State::grad16);
  const std::size_t count = part ? u.len : u.elems;
  const char* src = e.buffer(s.src_buf) + (s.src == Tier::gpu && part ? u.from * psz(e) : 0);
  char* dst = s.dst_buf >= 0 ? e.buffer(s.dst_buf) : e.tiers.unit_in(State::grad16, u);
  const adam::DType dt = e.o.precision;
  if (s.src == Tier::gpu) {
    if (dt == adam::DType::fp32) {
      e.k().accumulate(e.cx(), reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src), long(count));
    } else {
      e.k().to_fp32(e.cx(), e.gpt->grad_staging(), src, dt, long(count));
      e.k().accumulate_to(e.cx(), dst, e.gpt->grad_staging(), dt, long(count));
    }
    return on_stream(e, 0);
  }
  Token t;
  t.kind = Token::host;
  t.task = e.lane->post([dst, src, dt, count]() -> std::string {
    add_on_host(dst, src, dt, count);
    return "";
  });
  return t;
}

Result<Token> release(EngineContext&, const Step&) { return Token{}; }  // the plan reuses its bytes

// A pipeline stage's activations (forward) or their gradients (backward) to or from its neighbour
// stage, from or into the stage's buffers of the GPT's workspace (fp32). With tensor slicing each
// slice sends and receives its 1/mp part of the tensor (the same on every slice), and the hop-mp
// step all-gathers the received parts over the mp group (Megatron's scatter and gather).
Result<Token> p2p(EngineContext& e, const Step& s) {
  const bool gather = s.hop == Hop::mp;
  if (!e.pp_coll || (gather && !e.mp_coll)) return make_error("internal error: a pipeline message without its group");
  const bool recv = gather || s.collective.kind == CollectiveKind::recv, fwd = s.phase == Phase::forward;
  // the chunk the message belongs to: a forward receive and a backward send name its first block, a
  // forward send and a backward receive the block after its last
  const std::vector<StageBlocks>& chunks = e.gpt->chunks();
  int k = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i)
    if ((fwd == recv ? chunks[i].first : chunks[i].last) == s.block) k = int(i);
  float* buf = fwd ? (recv ? e.gpt->stage_input(k) : e.gpt->stage_output(k))
                   : (recv ? e.gpt->stage_grad_input(k) : e.gpt->stage_grad_output(k));
  const std::size_t part = e.gpt->stream_elems() / std::size_t(e.mp);
  if (gather) return collective_token(e.mp_coll->all_gather(buf, part, part, adam::DType::fp32));
  float* mine = buf + std::size_t(e.mp_rank) * part;
  const int peer = s.collective.root;
  return collective_token(recv ? e.pp_coll->recv(mine, part, adam::DType::fp32, peer)
                               : e.pp_coll->send(mine, part, adam::DType::fp32, peer));
}
Result<Token> all_to_all(EngineContext&, const Step&) {
  return unsupported("a mixture of experts' token all-to-all (the executor trains the paper's GPT)");
}

using Handler = Result<Token> (*)(EngineContext&, const Step&);
// One handler per step kind, in StepKind's order.
const std::array<Handler, kStepKinds> kHandlers = {
    fetch,      // fetch
    compute,    // compute
    release,    // release
    reduce,     // reduce_scatter
    reduce,     // allreduce
    offload,    // offload
    save_ckpt,  // save_ckpt
    load_ckpt,  // load_ckpt
    optimizer,  // optimizer
    p2p,         // p2p
    accumulate,  // accumulate
    all_to_all,  // all_to_all
    grad_norm,   // grad_norm
};

}  // namespace

Result<Token> issue_step(EngineContext& e, const Step& s) { return kHandlers[size_t(s.kind)](e, s); }

}  // namespace memwall::exec
