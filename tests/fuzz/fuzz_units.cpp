// libFuzzer target: the unit parser (parse_quantity for every dimension, parse_hidden) and the
// printers on whatever it accepts: accepted values are finite; printing never misbehaves.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/units.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memwall;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (Dimension d : {Dimension::bytes, Dimension::bandwidth, Dimension::flops_rate, Dimension::param_rate,
                      Dimension::count}) {
    Result<double> v = parse_quantity(text, d);
    if (fuzz::refused_in_one_line(v)) continue;
    if (!std::isfinite(*v)) fuzz::fail("accepted a non-finite quantity", std::string(text));
    (void)format_quantity(*v, d);
    (void)format_sig(*v);
    (void)format_count(*v);
  }
  Result<long> h = parse_hidden(text);
  if (!fuzz::refused_in_one_line(h) && (*h < 1 || *h > kMaxHidden)) fuzz::fail("hidden out of range", std::string(text));
  // The printers on raw bit patterns too: inf, NaN, denormals, huge values.
  if (size >= sizeof(double)) {
    double raw;
    __builtin_memcpy(&raw, data, sizeof raw);
    (void)format_bytes(raw);
    (void)format_bandwidth(raw);
    (void)format_flops_rate(raw);
    (void)format_count(raw);
    (void)format_sig(raw);
    (void)format_g(raw);
  }
  return 0;
}
