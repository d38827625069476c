// What every fuzz target checks of a loader's answer (issue 16): an input is either accepted or
// refused with a non-empty, one-line message; nothing else (a crash, an exception, a sanitizer
// finding, a hang) is allowed. Header-only; each target includes it once.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/analysis.hpp"
#include "model/model_spec.hpp"
#include "model/result.hpp"
#include "model/units.hpp"

namespace memwall::fuzz {

[[noreturn]] inline void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz check failed: %s: %s\n", what, detail.c_str());
  std::abort();
}

template <typename T>
bool refused_in_one_line(const Result<T>& r) {
  if (r) return false;
  if (r.error().empty()) fail("empty error message", "");
  if (r.error().find('\n') != std::string::npos) fail("message is not one line", r.error());
  return true;
}

inline void finite_positive(double v, const char* field) {
  if (!std::isfinite(v) || !(v > 0)) fail("accepted a value that is not finite and > 0", field);
}

// An accepted model of any kind: within the catalogue's ranges, its fields agree and every quantity
// derived from its operators is finite (parameter counts, Eq. 4, 5 and 11 generalised, the routed share).
inline void check_model_kind(const ModelSpec& m) {
  if (m.layers < 1 || m.layers > kMaxLayers || m.hidden < 1 || m.hidden > kMaxHidden || m.heads < 1 ||
      m.hidden % m.heads != 0 || m.seq < 1 || m.seq > kMaxSeq || m.vocab < 1 || m.vocab > kMaxVocab)
    fail("model out of range", m.name);
  if (m.kv() < 1 || m.heads % m.kv() != 0) fail("kv_heads does not divide heads", m.name);
  if (m.head_size < 0 || m.head_dim() < 1 || m.head_dim() > kMaxHidden) fail("head_dim out of range", m.name);
  if (m.is_moe() && (m.moe.experts_per_token < 1 || m.moe.experts_per_token > m.moe.experts ||
                     m.moe.expert_intermediate < 1))
    fail("moe fields disagree", m.name);
  finite_positive(model_param_count(m), "model_param_count");
  finite_positive(active_param_count(m), "active_param_count");
  if (active_param_count(m) > model_param_count(m) * (1 + 1e-12)) fail("more active than stored parameters", m.name);
  finite_positive(mswm_bytes(m), "mswm");
  finite_positive(awm_bytes(m, 1, m.seq, 1), "awm");
  finite_positive(ait_act_ckpt(m, 1), "ait_act_ckpt");
  finite_positive(active_weight_share(m), "active_weight_share");
}

}  // namespace memwall::fuzz
