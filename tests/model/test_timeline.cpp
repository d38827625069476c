// model/timeline: a Chrome trace read back is the trace written (the GUI opens `memwall run` and
// `memwall validate` traces through read_chrome_trace), and files that are not traces are refused
// with the file named.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "model/timeline.hpp"

namespace memwall {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Timeline, ChromeTraceReadsBackWhatWasWritten) {
  const std::vector<TraceEvent> events = {{"compute block0.qkv", "gpu0 gpu_compute", 0.0015, 0.004, 3, 0},
                                          {"fetch.nc adam[chunk 2]", "nvme", 0.25, 0.5, 17, 1},
                                          {"optimizer adam", "cpu", 1.0, 1.0, 20, 0}};
  const std::string path = write_temp("trace_roundtrip.json", chrome_trace_json(events, "memwall run"));
  Result<std::vector<TraceEvent>> back = read_chrome_trace(path);
  ASSERT_TRUE(back.ok()) << back.error();
  ASSERT_EQ(back->size(), events.size());  // the metadata events (thread and process names) are not steps
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ((*back)[i].name, events[i].name);
    EXPECT_EQ((*back)[i].track, events[i].track);
    EXPECT_EQ((*back)[i].step, events[i].step);
    EXPECT_EQ((*back)[i].rank, events[i].rank);
    EXPECT_NEAR((*back)[i].start_s, events[i].start_s, 1e-12);
    EXPECT_NEAR((*back)[i].end_s, events[i].end_s, 1e-12);
  }
  std::remove(path.c_str());
}

// Issue 31: simulate's and run's traces both used pid 0, so opened together their processes merged.
// An executed run's ranks are pid kExecutedTracePid + rank; reading back gives the rank.
TEST(Timeline, ExecutedAndSimulatedTracesUseDifferentProcesses) {
  const std::vector<TraceEvent> events = {{"compute block0.qkv", "gpu0 gpu_compute", 0.0, 0.001, 3, 0},
                                          {"compute block0.qkv", "gpu0 gpu_compute", 0.0, 0.001, 3, 1}};
  const std::string simulated = chrome_trace_json(events, "memwall simulate");
  const std::string executed = chrome_trace_json(events, "memwall run", kExecutedTracePid);
  EXPECT_NE(simulated.find("\"pid\":0"), std::string::npos);
  EXPECT_EQ(executed.find("\"pid\":0,"), std::string::npos) << executed;
  EXPECT_NE(executed.find("\"pid\":" + std::to_string(kExecutedTracePid + 1)), std::string::npos);
  const std::string path = write_temp("trace_executed.json", executed);
  Result<std::vector<TraceEvent>> back = read_chrome_trace(path);
  ASSERT_TRUE(back.ok()) << back.error();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].rank, 0);
  EXPECT_EQ((*back)[1].rank, 1);
  std::remove(path.c_str());
}

TEST(Timeline, FilesThatAreNotTracesAreRefusedByName) {
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {{"not json at all", "not JSON"},
                                   {R"({"traceEvents": 3})", "no traceEvents"},
                                   {R"({"other": []})", "no traceEvents"},
                                   {R"({"traceEvents": [{"ph": "X", "name": "a", "ts": 5, "dur": -2}]})",
                                    "event \"a\" has no valid ts/dur"}};
  for (const Case& c : cases) {
    const std::string path = write_temp("trace_bad.json", c.text);
    Result<std::vector<TraceEvent>> r = read_chrome_trace(path);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.error().find(path + ": " + c.expect), std::string::npos) << r.error();
    std::remove(path.c_str());
  }
  Result<std::vector<TraceEvent>> missing = read_chrome_trace("/nonexistent/trace.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error(), "/nonexistent/trace.json: no such trace file");
}

}  // namespace
}  // namespace memwall
