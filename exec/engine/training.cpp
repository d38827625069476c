#include "exec/engine/training.hpp"

#include <cmath>
#include <sstream>

namespace memwall::exec {

void RankBatch::next(const Corpus& corpus, std::uint64_t& rng, int sequences, int seq, int rank, int ranks) {
  corpus.next_batch(sequences * ranks, seq, rng, all_tokens, all_targets);
  const long from = long(rank) * sequences * seq, to = from + long(sequences) * seq;
  tokens.assign(all_tokens.begin() + from, all_tokens.begin() + to);
  targets.assign(all_targets.begin() + from, all_targets.begin() + to);
}

Result<TrainResult> train(Engine& engine, const Corpus& corpus, int seq, const TrainOptions& o, const OnStep& on_step) {
  TrainResult out;
  std::uint64_t rng = o.data_rng;
  const int sequences = engine.tokens_per_iteration() / seq;  // this rank's part of the global batch
  RankBatch batch;
  for (int i = o.first_step; i <= o.last_step; ++i) {
    const std::string at = "step " + std::to_string(i) + ": ";
    batch.next(corpus, rng, sequences, seq, engine.rank(), engine.ranks());
    Result<IterationReport> r = engine.step(batch.tokens, batch.targets);
    if (!r) return make_error(at + r.error());
    if (!std::isfinite(r->loss)) {
      std::ostringstream m;
      m << at << "the loss is " << r->loss << " (lower lr, or check the data); stopping";
      return make_error(m.str());
    }
    if (i == o.first_step) out.first_loss = r->loss;
    out.iteration_s.push_back(r->iteration_s);
    out.overlap.push_back(r->overlap);
    if (!o.save_dir.empty() && ((o.save_every > 0 && i % o.save_every == 0) || i == o.last_step))
      if (Result<bool> saved = engine.save(o.save_dir, {i, rng}); !saved) return make_error(at + saved.error());
    out.last = std::move(r).value();
    if (on_step)
      if (Result<bool> ok = on_step(i, out.last); !ok) return make_error(at + ok.error());
  }
  out.data_rng = rng;
  return out;
}

}  // namespace memwall::exec
