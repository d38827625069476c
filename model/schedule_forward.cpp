// The forward pass of one micro-step through one chunk of the stage's blocks (all of them unless
// interleaved): the embedding, the blocks and the head as one item list, so prefetch crosses block
// boundaries; a checkpoint saved as each segment starts, and one block's activations held while it
// runs.
#include "model/analysis.hpp"
#include "model/schedule_build.hpp"

namespace memwall::build {

namespace {

// Several micro-steps' checkpoints are alive at once in a pipeline (1F1B): named apart.
std::string ckpt_name(const Builder& b, int block, int u) {
  return "block" + std::to_string(block) + ".input" + (b.sh.micro_batches > 1 ? " mb" + std::to_string(u) : "") +
         (b.sh.grad_accum > 1 ? " acc" + std::to_string(b.e.accum) : "");
}

}  // namespace

std::pair<int, int> ckpt_key(const Builder& b, int block, int u) {
  return {block, u + b.sh.micro_batches * std::max(0, b.e.accum)};
}

std::string checkpoint_name(const Builder& b, int block, int u) { return ckpt_name(b, block, u); }

// Activations of one block kept in forward until the block ends (or, in backward, the AWM of a
// checkpoint segment: Eq. 5 per block), per micro-batch. Zero with a preallocated workspace.
double block_activation_bytes(const Shape& sh) {
  if (sh.workspace()) return 0;
  return awm_bytes(sh.m, sh.c.bsz, sh.c.seq, 1, sh.c.what_if.attention_density) / sh.c.mp;
}

namespace {

// The checkpoints of block `block`'s input (one per micro-batch), saved once the compute before
// finished and what the next compute waits for has arrived (a later pipeline stage's first block:
// the received activations); returns the save steps.
std::vector<int> save_checkpoints(Builder& b, int block) {
  const Shape& sh = b.sh;
  const Tier ct = sh.pl.act_ckpt.tier;
  std::vector<int> saves;
  for (int u = 0; u < sh.micro_batches; ++u) {
    const int buf = b.e.buffer(BufferKind::ckpt, "ckpt:" + ckpt_name(b, block, u), ct, sh.kept_ckpt_bytes());
    Step st = transfer({StepKind::save_ckpt, Phase::forward, ct == Tier::gpu ? Hop::none : Hop::gc, State::act_ckpt,
                        sh.kept_ckpt_bytes(), Tier::gpu, ct, link_between(Tier::gpu, ct)},
                       "block" + std::to_string(block) + ".input", deps({b.chain.last}), -1, buf);
    for (int d : b.chain.next_deps)
      if (b.e.step(d).kind == StepKind::p2p) st.deps.push_back(d);
    st.micro_batch = sh.micro_batches > 1 ? u : -1;
    st.block = block;
    const int id = b.e.emit(std::move(st));
    b.e.step(id).allocs.push_back(buf);
    b.ckpts.saved[ckpt_key(b, block, u)] = id;
    b.ckpts.buf[ckpt_key(b, block, u)] = buf;
    saves.push_back(id);
  }
  return saves;
}

}  // namespace

// A block's input is the previous block's output, whose memory the next block reuses: the first
// compute after a block waits for the checkpoint saved from that block's input.
void forward(Builder& b, int k) {
  const Shape& sh = b.sh;
  const StageBlocks& cb = sh.chunks[size_t(k)];
  Pipe& pipe = b.pipe[size_t(k)];
  std::vector<Item> items;
  if (sh.starts_pipeline(k)) {
    items = sh.items_of(sh.head_ops, Phase::forward);
  } else {
    // into the buffer the previous micro-step's pass read, and its checkpoint copied
    std::vector<int> d = deps({pipe.forward_done});
    d.insert(d.end(), pipe.forward_saves.begin(), pipe.forward_saves.end());
    b.chain.next_deps.push_back(p2p(b, Phase::forward, Hop::recv, k, std::move(d)));
  }
  for (int blk = cb.first; blk < cb.last; ++blk) {
    std::vector<Item> bi = sh.items_of(sh.block_ops(blk), Phase::forward);
    items.insert(items.end(), bi.begin(), bi.end());
  }
  if (sh.ends_pipeline(k)) {
    std::vector<Item> tail = sh.items_of(sh.tail_ops, Phase::forward);
    items.insert(items.end(), tail.begin(), tail.end());
  }
  const double act = block_activation_bytes(sh);  // l2l: one micro-batch in the block at a time
  int open_block = -1, open_act = -1;
  std::vector<int> saves_of_open;  // checkpoints taken from the open block's input
  run_items(b, items, [&](size_t i) {
    const int blk = sh.g.op(items[i].v).block;
    if (blk == open_block) return;
    if (open_act >= 0) b.e.free_at(b.chain.last, open_act);
    open_act = -1;
    b.chain.next_deps.insert(b.chain.next_deps.end(), saves_of_open.begin(), saves_of_open.end());
    saves_of_open.clear();
    open_block = blk;
    if (blk < 0) return;
    if ((blk - cb.first) % sh.c.ci == 0) saves_of_open = save_checkpoints(b, blk);
    if (act > 0) {
      open_act = b.e.buffer(BufferKind::activations, "act:block" + std::to_string(blk), Tier::gpu, act);
      b.chain.next_allocs.push_back(open_act);
    }
  });
  pipe.forward_done = b.chain.last;
  // a chunk without the LM head ends on a block: its activations go once the output is sent
  if (!sh.ends_pipeline(k)) {
    if (pipe.forward_sent >= 0) b.e.step(b.chain.last).deps.push_back(pipe.forward_sent);
    const int sent = p2p(b, Phase::forward, Hop::send, k, deps({b.chain.last}));
    pipe.forward_sent = sent;
    if (open_act >= 0) b.e.free_at(sent, open_act);
  }
  // a chunk that ends on a block (no LM head) still reads that block's input into its checkpoints:
  // the next compute, and the next micro-step's receive into that input, wait for the copies
  pipe.forward_saves = saves_of_open;
  b.chain.next_deps = saves_of_open;
}

}  // namespace memwall::build
