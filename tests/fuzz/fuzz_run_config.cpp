// libFuzzer target: `memwall run` config YAML (exec::parse_run_config). Accepted configs hold a
// model the executor can build (hidden a multiple of heads, kv_heads a divisor of heads, every count
// >= 1, a kind it trains) and a finite lr.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "exec/engine/run_config.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memwall;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Result<exec::RunConfig> r = exec::parse_run_config("fuzz.yaml", text);
  if (fuzz::refused_in_one_line(r)) return 0;
  const exec::RunConfig& c = *r;
  if (c.model.layers < 1 || c.model.heads < 1 || c.model.hidden % c.model.heads != 0 || c.steps < 1 || c.bsz < 1 ||
      c.seq < 1)
    fuzz::fail("accepted a run config the executor cannot build", "");
  if (!std::isfinite(c.lr) || !(c.lr > 0) || !std::isfinite(c.weight_decay) || c.weight_decay < 0)
    fuzz::fail("accepted a non-finite or non-positive lr / weight decay", "");
  // the block's kind: what GptOps::create checks again, and what the executor trains
  if (c.model.kv_heads < 0 || c.model.heads % c.model.kv() != 0 || c.model.intermediate < 0 ||
      !std::isfinite(c.model.rope_theta) || !(c.model.rope_theta > 0))
    fuzz::fail("accepted a kind the executor cannot build", "");
  if (!exec::executor_trains(exec::gpt_model_spec(c.model)))
    fuzz::fail("accepted a model the executor refuses to train", "");
  return 0;
}
