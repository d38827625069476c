// A fault-injecting wrapper around a real backend (tests): every operation goes to the real one,
// but an event it records is reported complete only some random time after the real stream
// reached it, so a caller sees completions late and in orders the real backend alone would not
// produce; optionally a synchronize returns late, as after a slow kernel. Delays come from a seeded
// generator: the same seed, the same delays. Owns the real backend. Thread-safety: as the backend
// it wraps (one thread drives it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "exec/backend/backend.hpp"

namespace memwall::exec {

struct DelayOptions {
  std::uint64_t seed = 1;
  double max_delay_s = 1e-3;  // each event completes up to this long after the real one
  // When set, the delay of the n-th event recorded (from 0) instead of a random one.
  std::function<double(std::uint64_t n)> delay_for{};
  // When set, the n-th synchronize (from 0) returns this long after the real one: a kernel that
  // ran slow, as a machine's jitter or another process on its cores makes one.
  std::function<double(std::uint64_t n)> synchronize_delay_for{};
};

std::unique_ptr<Backend> delaying_backend(std::unique_ptr<Backend> real, const DelayOptions& options);

}  // namespace memwall::exec
