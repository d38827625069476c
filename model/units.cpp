#include "model/units.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

namespace memwall {
namespace {

struct UnitEntry {
  std::string_view symbol;
  double factor;
};

// Case-sensitive: "Gb" (gigabit) and "GB" (gigabyte) must not collide.
constexpr std::array<UnitEntry, 11> kByteUnits{{
    {"B", 1.0},
    {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15},
    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
    {"TiB", 1099511627776.0}, {"PiB", 1125899906842624.0},
}};

constexpr std::array<UnitEntry, 5> kBitUnits{{
    {"bps", 1.0 / 8}, {"Kbps", 1e3 / 8}, {"Mbps", 1e6 / 8}, {"Gbps", 1e9 / 8}, {"Tbps", 1e12 / 8},
}};

constexpr std::array<UnitEntry, 6> kDecimalPrefixes{{
    {"", 1.0}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

template <size_t N>
bool lookup(const std::array<UnitEntry, N>& table, std::string_view unit, double* factor) {
  for (const auto& e : table)
    if (e.symbol == unit) {
      *factor = e.factor;
      return true;
    }
  return false;
}

// A decimal prefix (K, M, G, T, P; also lower-case k) followed by `rest`, compared by `eq`.
template <typename Eq>
bool prefixed(std::string_view unit, std::string_view rest, Eq eq, double* factor) {
  for (const auto& p : kDecimalPrefixes) {
    if (unit.size() != p.symbol.size() + rest.size()) continue;
    std::string_view head = unit.substr(0, p.symbol.size());
    bool head_ok = head == p.symbol || (p.symbol == "K" && head == "k");
    if (head_ok && eq(unit.substr(p.symbol.size()), rest)) {
      *factor = p.factor;
      return true;
    }
  }
  return false;
}

bool unit_factor(std::string_view unit, Dimension d, double* factor) {
  auto exact = [](std::string_view a, std::string_view b) { return a == b; };
  auto caseless = [](std::string_view a, std::string_view b) { return iequals(a, b); };
  switch (d) {
    case Dimension::bytes:
      if (unit == "kB") unit = "KB";
      return lookup(kByteUnits, unit, factor);
    case Dimension::bandwidth: {
      if (lookup(kBitUnits, unit, factor)) return true;
      if (unit.size() > 2 && unit.substr(unit.size() - 2) == "/s") {
        std::string_view base = unit.substr(0, unit.size() - 2);
        if (base == "kB") base = "KB";
        if (lookup(kByteUnits, base, factor)) return true;
        // Bits per second written as Gb/s or Gbit/s.
        if (prefixed(base, "b", exact, factor) || prefixed(base, "bit", exact, factor)) {
          *factor /= 8;
          return true;
        }
      }
      return false;
    }
    case Dimension::flops_rate:
      return prefixed(unit, "FLOPS", caseless, factor) || prefixed(unit, "FLOP/s", caseless, factor);
    case Dimension::param_rate:
      return prefixed(unit, "params/s", exact, factor) || prefixed(unit, "param/s", exact, factor);
    case Dimension::count:
      if (unit == "B") {  // billions, as the paper writes model sizes ("1.4B")
        *factor = 1e9;
        return true;
      }
      return prefixed(unit, "", exact, factor);
  }
  return false;
}

}  // namespace

std::string_view dimension_example(Dimension d) {
  switch (d) {
    case Dimension::bytes: return "a size with a unit, such as 32 GiB or 1.5 TB";
    case Dimension::bandwidth: return "a bandwidth with a unit, such as 70 GB/s or 800 Gbps";
    case Dimension::flops_rate: return "a compute rate with a unit, such as 125 TFLOPS";
    case Dimension::param_rate: return "a parameter rate with a unit, such as 1.5 G params/s";
    case Dimension::count: return "a count, such as 4096, 100M or 1.4B";
  }
  return "a quantity";
}

QuantityRange quantity_range(Dimension d) {
  switch (d) {
    case Dimension::bytes: return {1.0, 1180591620717411303424.0};  // 1 B .. 2^70 B (1024 EiB)
    case Dimension::bandwidth: return {1.0, 1e18};
    case Dimension::flops_rate: return {1.0, 1e21};
    case Dimension::param_rate: return {1.0, 1e18};
    case Dimension::count: return {0.0, 1e18};
  }
  return {0.0, 1e18};
}

namespace {
std::string scaled(double v, double base, const char* const* names, int n);  // below
}  // namespace

std::string format_quantity(double value, Dimension d) {
  switch (d) {
    case Dimension::bytes: return format_bytes(value);
    case Dimension::bandwidth: return format_bandwidth(value);
    case Dimension::flops_rate: return format_flops_rate(value);
    case Dimension::param_rate: {  // "2.05 G params/s", as the profiles write it
      static const char* const names[] = {"params/s", "K params/s", "M params/s", "G params/s", "T params/s"};
      return scaled(value, 1000.0, names, 5);
    }
    case Dimension::count: return format_g(value);
  }
  return format_g(value);
}

Result<double> parse_quantity(std::string_view text, Dimension d) {
  std::string_view s = trim(text);
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || s.empty())
    return make_error("expected " + std::string(dimension_example(d)) + ", got \"" + std::string(text) + "\"");
  std::string_view unit = trim(std::string_view(end, s.data() + s.size() - end));
  if (unit.empty() && d != Dimension::count)
    return make_error("expected " + std::string(dimension_example(d)) + ", got \"" + std::string(text) +
                      "\" (a unit is required)");
  // "1.5 G params/s" has a space between prefix and unit; join it.
  std::string joined(unit);
  if (d == Dimension::param_rate) {
    auto sp = joined.find(' ');
    if (sp != std::string::npos) joined.erase(sp, joined.find_first_not_of(' ', sp) - sp);
  }
  double factor = 1.0;
  if (!unit_factor(joined, d, &factor))
    return make_error("expected " + std::string(dimension_example(d)) + ", got \"" + std::string(text) +
                      "\" (unknown unit \"" + std::string(unit) + "\")");
  // from_chars reads "inf" and "nan"; a finite value can still overflow once scaled ("1e308 TB").
  if (!std::isfinite(value) || !std::isfinite(value * factor))
    return make_error("expected a finite number, got \"" + std::string(text) + "\"");
  return value * factor;
}

Result<long> parse_hidden(std::string_view text) {
  std::string_view s = trim(text);
  long value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  std::string_view rest(end, s.data() + s.size() - end);
  const long scale = rest.empty() ? 1 : 1024;
  if (ec != std::errc() || s.empty() || !(rest.empty() || rest == "K" || rest == "k") || value <= 0 ||
      value > kMaxHidden / scale)
    return make_error("expected a positive hidden size up to " + std::to_string(kMaxHidden / 1024) +
                      "K such as 4096 or 64K (K = 1024), got \"" + std::string(text) + "\"");
  return value * scale;
}

std::string format_sig(double value, int significant) {
  if (value == 0) return "0";
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf";
  char buf[64];
  if (std::fabs(value) >= 1e15 || std::fabs(value) < 1e-9) {  // fixed notation would not fit in buf
    std::snprintf(buf, sizeof buf, "%.*g", significant, value);
    return buf;
  }
  int digits = significant - 1 - static_cast<int>(std::floor(std::log10(std::fabs(value))));
  if (digits < 0) digits = 0;
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string format_g(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", value);
  return buf;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

namespace {
std::string scaled(double v, double base, const char* const* names, int n) {
  if (!std::isfinite(v)) return format_sig(v) + " " + names[0];
  int i = 0;
  while (i + 1 < n && std::fabs(v) >= base * 0.9995) {  // 999.96 MB prints as 1.00 GB
    v /= base;
    ++i;
  }
  return format_sig(v) + " " + names[i];
}
}  // namespace

std::string format_bytes(double bytes) {
  static const char* const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  return scaled(bytes, 1024.0, names, 7);
}
std::string format_bytes_decimal(double bytes) {
  static const char* const names[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  return scaled(bytes, 1000.0, names, 7);
}
std::string format_bandwidth(double bytes_per_s) {
  static const char* const names[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s", "PB/s"};
  return scaled(bytes_per_s, 1000.0, names, 6);
}
std::string format_flops_rate(double flops_per_s) {
  static const char* const names[] = {"FLOPS", "KFLOPS", "MFLOPS", "GFLOPS", "TFLOPS", "PFLOPS", "EFLOPS"};
  return scaled(flops_per_s, 1000.0, names, 7);
}
std::string format_count(double n) {
  static const char* const names[] = {"", "K", "M", "B", "T", "Q"};
  std::string s = scaled(n, 1000.0, names, 6);
  if (s.back() == ' ') s.pop_back();
  return s;
}

std::string format_count_words(double n) {
  static const char* const names[] = {"", "thousand", "million", "billion", "trillion", "quadrillion"};
  std::string s = scaled(n, 1000.0, names, 6);
  if (s.back() == ' ') s.pop_back();
  return s;
}

double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = std::clamp(q, 0.0, 1.0) * double(v.size() - 1);
  const size_t lo = size_t(at);
  return lo + 1 < v.size() ? v[lo] + (at - double(lo)) * (v[lo + 1] - v[lo]) : v[lo];
}

}  // namespace memwall
