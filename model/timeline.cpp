#include "model/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/units.hpp"

namespace memwall {

std::string chrome_trace_json(const std::vector<TraceEvent>& events, const std::string& process_name, int pid_base) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  std::map<std::string, int> tid;
  std::map<int, bool> ranks;
  for (const TraceEvent& e : events) {
    if (!tid.count(e.track)) tid[e.track] = int(tid.size());
    ranks[e.rank] = true;
  }
  for (const auto& [rank, unused] : ranks) {
    for (const auto& [track, id] : tid)
      out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid_base + rank}, {"tid", id}, {"args", {{"name", track}}}});
    out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid_base + rank},
                   {"args", {{"name", process_name + (ranks.size() > 1 ? " rank " + std::to_string(rank) : "")}}}});
  }
  for (const TraceEvent& e : events)
    out.push_back({{"name", e.name}, {"cat", e.track}, {"ph", "X"}, {"pid", pid_base + e.rank}, {"tid", tid[e.track]},
                   {"ts", e.start_s * 1e6}, {"dur", (e.end_s - e.start_s) * 1e6}, {"args", {{"step", e.step}}}});
  return nlohmann::ordered_json{{"displayTimeUnit", "ms"}, {"traceEvents", out}}.dump() + "\n";
}

Result<std::vector<TraceEvent>> read_chrome_trace(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return make_error(path + ": no such trace file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > (std::uintmax_t(256) << 20)) return make_error(path + ": larger than 256 MiB, not read");
  std::ifstream in(path, std::ios::binary);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return make_error(path + ": not JSON (expected a Chrome trace from memwall)");
  const nlohmann::json* ev = j.is_object() && j.contains("traceEvents") ? &j["traceEvents"] : j.is_array() ? &j : nullptr;
  if (!ev || !ev->is_array()) return make_error(path + ": no traceEvents (expected a Chrome trace from memwall)");
  std::vector<TraceEvent> out;
  for (const nlohmann::json& e : *ev) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const auto num = [&](const char* k) { return e.contains(k) && e[k].is_number() ? e[k].get<double>() : 0.0; };
    TraceEvent t;
    t.name = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : "";
    t.track = e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
    t.start_s = num("ts") * 1e-6;
    t.end_s = t.start_s + num("dur") * 1e-6;
    t.rank = e.contains("pid") && e["pid"].is_number_integer() ? e["pid"].get<int>() : 0;
    if (t.rank >= kExecutedTracePid) t.rank -= kExecutedTracePid;
    if (e.contains("args") && e["args"].is_object() && e["args"].contains("step") && e["args"]["step"].is_number_integer())
      t.step = e["args"]["step"].get<int>();
    if (!std::isfinite(t.start_s) || !std::isfinite(t.end_s) || t.end_s < t.start_s)
      return make_error(path + ": event \"" + one_line(t.name) + "\" has no valid ts/dur");
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

using Interval = std::pair<double, double>;

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

double measure(const std::vector<Interval>& m) {
  double s = 0;
  for (const Interval& i : m) s += i.second - i.first;
  return s;
}

// Measure of `a` (merged) outside `b` (merged).
double outside(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double s = 0;
  size_t j = 0;
  for (const Interval& i : a) {
    double at = i.first;
    while (j < b.size() && b[j].second <= at) ++j;
    for (size_t k = j; k < b.size() && b[k].first < i.second; ++k) {
      if (b[k].first > at) s += b[k].first - at;
      at = std::max(at, b[k].second);
      if (at >= i.second) break;
    }
    if (at < i.second) s += i.second - at;
  }
  return s;
}

}  // namespace

OverlapReport overlap_report(const Schedule& s, const std::vector<StepTime>& times) {
  OverlapReport r;
  std::vector<Interval> compute;
  std::array<std::vector<Interval>, kLinkClasses> link;
  std::array<Interval, 4> phase;
  phase.fill({1e300, -1e300});
  double first = 0, last = 0;
  bool any = false;
  for (const StepTime& t : times) {
    if (t.step < 0 || t.step >= int(s.steps.size())) continue;
    const Step& st = s.steps[size_t(t.step)];
    first = any ? std::min(first, t.start_s) : t.start_s;
    last = any ? std::max(last, t.end_s) : t.end_s;
    any = true;
    Interval& ph = phase[size_t(st.phase)];
    ph = {std::min(ph.first, t.start_s), std::max(ph.second, t.end_s)};
    if (st.kind == StepKind::compute || st.kind == StepKind::optimizer) compute.push_back({t.start_s, t.end_s});
    else if (st.link != LinkClass::none && st.bytes > 0) link[int(st.link)].push_back({t.start_s, t.end_s});
  }
  r.iteration_s = any ? last - first : 0;
  for (size_t p = 0; p < phase.size(); ++p) r.phase_s[p] = std::max(0.0, phase[p].second - phase[p].first);
  const std::vector<Interval> busy = merged(compute);
  r.compute_s = measure(busy);
  double moved = 0, exposed = 0;
  for (int c = 0; c < kLinkClasses; ++c) {
    const std::vector<Interval> m = merged(link[size_t(c)]);
    r.transfer_s[size_t(c)] = measure(m);
    r.exposed_s[size_t(c)] = outside(m, busy);
    moved += r.transfer_s[size_t(c)];
    exposed += r.exposed_s[size_t(c)];
  }
  r.hidden_fraction = moved > 0 ? 1 - exposed / moved : 1;
  return r;
}

std::size_t steady_from(std::size_t iterations) { return iterations > 2 ? 1 : 0; }

OverlapReport median_overlap(const std::vector<OverlapReport>& reports) {
  OverlapReport m;
  if (reports.empty()) return m;
  auto med = [&](auto field) {
    std::vector<double> v;
    for (const OverlapReport& r : reports) v.push_back(field(r));
    return median(std::move(v));
  };
  m.iteration_s = med([](const OverlapReport& r) { return r.iteration_s; });
  m.compute_s = med([](const OverlapReport& r) { return r.compute_s; });
  m.hidden_fraction = med([](const OverlapReport& r) { return r.hidden_fraction; });
  for (std::size_t p = 0; p < m.phase_s.size(); ++p) m.phase_s[p] = med([p](const OverlapReport& r) { return r.phase_s[p]; });
  for (std::size_t l = 0; l < m.transfer_s.size(); ++l) {
    m.transfer_s[l] = med([l](const OverlapReport& r) { return r.transfer_s[l]; });
    m.exposed_s[l] = med([l](const OverlapReport& r) { return r.exposed_s[l]; });
  }
  return m;
}

}  // namespace memwall
