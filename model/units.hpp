// Units: parse and print sizes, bandwidths, compute rates and counts.
// Inside memwall every quantity is an SI double (bytes, bytes/s, flop/s); units exist only at
// the edges (YAML, flags, printed text). Binary (KiB, GiB) and decimal (KB, GB) prefixes are
// distinct; bits ("Gbps", "Gb/s") are divided by 8. Pure functions, thread-safe.
#pragma once

#include <string>
#include <vector>
#include <string_view>

#include "model/result.hpp"

namespace memwall {

enum class Dimension {
  bytes,        // "32 GiB", "1.5 TB", "512 B"
  bandwidth,    // "70 GB/s", "12 GiB/s", "800 Gbps", "100 Gb/s"  -> bytes per second
  flops_rate,   // "125 TFLOPS", "70 TFLOP/s", "62 Tflops"          -> flop per second
  param_rate,   // "1.5 G params/s", "800M params/s"                 -> parameters per second
  count,        // "100M", "1.4B", "20T", "4096" (decimal; unit optional) -> plain number
};

// What a value of this dimension looks like, for error messages ("a size such as 32 GiB").
std::string_view dimension_example(Dimension d);

// Parses "<number> <unit>" for the given dimension. A unit is required for every dimension but
// `count`. NaN, infinity and values that overflow once scaled are errors. Errors say what was
// expected and what was given, without file or field (the caller adds those).
Result<double> parse_quantity(std::string_view text, Dimension d);

// The values an input may give for each dimension, so every formula downstream stays finite: at
// least 1 B, 1 B/s, 1 FLOPS, 1 param/s (counts: > 0) and at most 1024 EiB, 1 EB/s, 1 ZFLOPS,
// 1e18 params/s, 1e18.
struct QuantityRange {
  double min;  // inclusive; for count, exclusive 0
  double max;  // inclusive
};
QuantityRange quantity_range(Dimension d);

// `value` printed in its dimension's unit ("1024 EiB", "1000 PB/s"), for messages.
std::string format_quantity(double value, Dimension d);

// Hidden sizes as the paper writes them: "64K" is 65536 (K = 1024 here, Table 1 caption), at most
// kMaxHidden (the paper's largest is 160K).
inline constexpr long kMaxHidden = 1L << 20;
Result<long> parse_hidden(std::string_view text);

// Printing, three significant digits: "1.83 TiB", "70.0 GB/s", "62.0 TFLOPS", "1.50 G".
std::string format_bytes(double bytes);          // binary prefixes (KiB ... PiB)
std::string format_bytes_decimal(double bytes);  // decimal prefixes (KB ... PB)
std::string format_bandwidth(double bytes_per_s);  // decimal GB/s, as datasheets print it
std::string format_flops_rate(double flops_per_s);
std::string format_count(double n);  // 1.4 B, 20 T (decimal)
// A count in words, for tables where "B" would read as bytes: 101 billion, 1.01 trillion.
std::string format_count_words(double n);
std::string format_sig(double value, int significant = 3);
std::string format_g(double value);  // shortest form: 2, 1.25, 1e+12
// One CSV field (RFC 4180): quoted, with inner quotes doubled, when it holds a comma, quote or newline.
std::string csv_field(const std::string& text);

// The median of a sample (the mean of the middle two for an even count); 0 for none. Timings in
// reports (run, validate, calibrate, adam-bench) use it.
double median(std::vector<double> v);
// The q-quantile (0 <= q <= 1) of a sample, interpolated linearly between the sorted values
// (quantile(v, 0.5) is median(v)); 0 for none.
double quantile(std::vector<double> v, double q);

}  // namespace memwall
