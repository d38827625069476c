// Bad input never crashes, hangs or is silently wrong (issue 16): the YAML reader refuses
// duplicate and non-string keys, out-of-range integers before they are narrowed, NaN, infinity and
// overflowing quantities, alias bombs and deep nesting; read_input_file gives one line for every
// way a file cannot be read; the training config refuses sentinels and work the machine cannot
// hold; numbers print without undefined behaviour whatever their value.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/placement.hpp"
#include "model/schedule.hpp"
#include "model/training_config.hpp"
#include "model/units.hpp"
#include "model/yaml_reader.hpp"

namespace memwall {
namespace {

namespace fs = std::filesystem;

const char* kProfile = R"(name: t
nodes: 1
gpu:
  count_per_node: 2
  memory: 16 GiB
  peak: 10 TFLOPS
links:
  gpu_gpu: 50 GB/s
  pcie_single_gpu: 10 GB/s
  pcie_aggregate: 16 GB/s
cpu:
  memory: 64 GB
  memory_bandwidth: 40 GB/s
  adam_throughput: 1 G params/s
  pinned_budget: 8 GiB
nvme:
  capacity: 1 TB
  read: 3 GB/s
  write: 2 GB/s
)";

std::string edited(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

// The error of a profile that must be refused; it must be one line.
std::string profile_error(const std::string& yaml) {
  Result<HardwareProfile> r = parse_profile(yaml, "t.yaml");
  EXPECT_FALSE(r.ok()) << "accepted:\n" << yaml;
  if (r.ok()) return "";
  EXPECT_EQ(r.error().find('\n'), std::string::npos) << r.error();
  return r.error();
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "got: " << (haystack) << "\nwanted: " << (needle)

TEST(YamlReader, DuplicateKeysAreErrorsNotFirstWins) {
  EXPECT_HAS(profile_error(edited(kProfile, "  peak: 10 TFLOPS\n", "  peak: 10 TFLOPS\n  peak: 99 TFLOPS\n")),
             "t.yaml:7: gpu.peak: given twice (first at line 6)");
  EXPECT_HAS(profile_error(std::string(kProfile) + "name: u\n"), "t.yaml:20: name: given twice (first at line 1)");
  // The same key spelled as a quoted string is the same key.
  EXPECT_HAS(profile_error(std::string(kProfile) + "\"nodes\": 1\n"), "nodes: given twice");
}

// Found by libFuzzer (tests/fuzz): yaml-cpp quotes the offending character, so an escape such as
// "\<vertical tab>" in a quoted value put a control character in the message; a size's text was
// echoed as given, line breaks included.
TEST(YamlReader, ControlCharactersInInputAreEscapedInMessages) {
  const std::string e = profile_error(edited(kProfile, "name: t\n", "name: \"a\\\v\"\n"));
  EXPECT_HAS(e, "t.yaml:1: malformed YAML: unknown escape character: \\x0b");
  Result<double> q = parse_quantity("3\n\x1b[31mGiB", Dimension::bytes);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().find('\n'), std::string::npos) << q.error();
  EXPECT_EQ(q.error().find('\x1b'), std::string::npos) << q.error();
  EXPECT_HAS(q.error(), "3\\n\\x1b[31mGiB");
  EXPECT_EQ(one_line("a\r\nb\x7f \n"), "a\\r\\nb\\x7f");
}

// Found by libFuzzer (CI at stop 51, every YAML target timed out): YAML::LoadAll, used to refuse a
// second document, loops forever in yaml-cpp 0.7 when its parser cannot advance past a token,
// appending null documents until memory runs out. The reader reads two documents at most.
TEST(YamlReader, TextTheParserCannotReadAfterTheFirstDocumentIsRefusedNotLoopedOn) {
  const std::string profile(kProfile);
  const std::string after = ":" + std::to_string(std::count(profile.begin(), profile.end(), '\n') + 2) +
                            ": a second document after the first";
  EXPECT_HAS(profile_error(profile + "---\n,\n"), after);
  EXPECT_HAS(profile_error(profile + "---\n]\n"), "t.yaml:");
  EXPECT_HAS(profile_error(profile + "---\nname: u\n"), after);
  EXPECT_HAS(profile_error(profile + "...\n,\n"), after);
  EXPECT_TRUE(parse_profile(profile + "---\n", "t.yaml").ok()) << "a trailing `---` holds nothing to drop";
  EXPECT_HAS(profile_error(",\n"), "t.yaml:1: expected a YAML mapping at the top level");
}

TEST(YamlReader, KeysMustBePlainStrings) {
  Result<Placement> r = parse_placement("preset: zero3\n? {a: 1}\n: 3\n", "p.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_HAS(r.error(), "p.yaml:2: key: expected a field name");
  Result<Placement> list_key = parse_placement("preset: zero3\nparam16:\n  ? [tier]\n  : cpu\n", "p.yaml");
  ASSERT_FALSE(list_key.ok());
  EXPECT_HAS(list_key.error(), "p.yaml:3: param16: expected a field name");
}

TEST(YamlReader, IntegersAreRangeCheckedBeforeNarrowing) {
  // 2^32 used to become 0 nodes, 2^31 GPUs a negative count, 2^32 + 4 heads 4.
  EXPECT_HAS(profile_error(edited(kProfile, "nodes: 1", "nodes: 4294967296")),
             "t.yaml:2: nodes: expected an integer from 1 to 65536, got \"4294967296\"");
  EXPECT_HAS(profile_error(edited(kProfile, "count_per_node: 2", "count_per_node: 2147483648")),
             "t.yaml:4: gpu.count_per_node: expected an integer from 1 to 1024, got \"2147483648\"");
  EXPECT_HAS(profile_error(edited(kProfile, "count_per_node: 2", "count_per_node: 1e9")),
             "gpu.count_per_node: expected an integer from 1 to 1024, got \"1e9\"");
  for (const char* heads : {"4294967296", "4294967300", "99999999999999999999", "-1", "0", "4.0", "0x10"}) {
    Result<ModelSpec> m = parse_model_spec(std::string("layers: 2\nhidden: 1024\nheads: ") + heads + "\n", "m.yaml");
    ASSERT_FALSE(m.ok()) << heads;
    EXPECT_HAS(m.error(), std::string("m.yaml:3: heads: expected an integer from 1 to 65536, got \"") + heads + "\"");
  }
  EXPECT_HAS(parse_model_spec("layers: 1000000\nhidden: 1024\nheads: 8\n", "m.yaml").error(),
             "layers: expected an integer from 1 to 100000");
  EXPECT_HAS(parse_model_spec("layers: 2\nhidden: 1024\nheads: 8\nvocab: 0\n", "m.yaml").error(),
             "m.yaml:4: vocab: expected an integer from 1 to 16777216, got \"0\"");
}

TEST(YamlReader, QuantitiesAreFiniteAndPlausible) {
  EXPECT_HAS(profile_error(edited(kProfile, "memory: 16 GiB", "memory: inf GiB")), "gpu.memory: expected a finite number");
  EXPECT_HAS(profile_error(edited(kProfile, "memory: 16 GiB", "memory: nan GiB")), "gpu.memory: expected a finite number");
  EXPECT_HAS(profile_error(edited(kProfile, "memory: 16 GiB", "memory: 1e308 TiB")), "gpu.memory: expected a finite number");
  EXPECT_HAS(profile_error(edited(kProfile, "memory: 16 GiB", "memory: 1e300 B")), "gpu.memory: expected at most 1024 EiB");
  EXPECT_HAS(profile_error(edited(kProfile, "read: 3 GB/s", "read: 1e-300 GB/s")), "nvme.read: expected at least 1.00 B/s");
  EXPECT_HAS(profile_error(edited(kProfile, "peak: 10 TFLOPS", "peak: 1e30 TFLOPS")), "gpu.peak: expected at most");
  EXPECT_HAS(profile_error(edited(kProfile, "peak: 10 TFLOPS", "peak: .inf TFLOPS")), "gpu.peak: expected");
}

TEST(YamlReader, AliasBombsAndDeepNestingAreRefused) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'h'; ++c)
    bomb += std::string(1, c) + ": &" + c + " [*" + char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) + ", *" +
            char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) +
            ", *" + char(c - 1) + ", *" + char(c - 1) + "]\n";
  EXPECT_HAS(profile_error(bomb), "more than 100000 YAML nodes");
  std::string deep = "name: " + std::string(40, '[') + std::string(40, ']') + "\n";
  EXPECT_HAS(profile_error(deep), "nested deeper than 32 levels");
  // Very deep flow nesting is yaml-cpp's own limit; it must still be one line.
  std::string deeper = "name: " + std::string(5000, '[') + std::string(5000, ']') + "\n";
  EXPECT_HAS(profile_error(deeper), "t.yaml");
}

TEST(YamlReader, BooleansAreTrueOrFalse) {
  Result<Placement> r = parse_placement("preset: zero3\noptim32: {tier: cpu, partitioned: yes}\n", "p.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_HAS(r.error(), "p.yaml:2: optim32.partitioned: expected true or false, got \"yes\"");
}

class InputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("memwall-input-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_ / "locked", fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

TEST_F(InputFiles, EveryFailureIsOneLineNamingTheFile) {
  auto error = [](const std::string& p) {
    Result<std::string> r = read_input_file(p, "profile");
    EXPECT_FALSE(r.ok()) << p;
    return r.ok() ? std::string() : r.error();
  };
  EXPECT_EQ(error(path("nope.yaml")), path("nope.yaml") + ": no such profile file");
  EXPECT_EQ(error(dir_.string()), dir_.string() + ": is a folder, not a profile file");
  fs::create_symlink("loop_b", dir_ / "loop_a");
  fs::create_symlink("loop_a", dir_ / "loop_b");
  EXPECT_HAS(error(path("loop_a")), "loop_a: cannot read the profile file: too many levels of symbolic links");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_HAS(error(path("fifo")), "fifo: not a regular file");  // and does not wait for a writer
  EXPECT_HAS(error("/dev/zero"), "/dev/zero: not a regular file");
  EXPECT_HAS(error("/proc/self/mem"), "/proc/self/mem: cannot read the profile file: ");
  write("big.yaml", std::string(kMaxInputFileBytes + 1, '#'));
  EXPECT_HAS(error(path("big.yaml")), "larger than any profile file (at most 1.00 MiB)");
  EXPECT_HAS(error(""), "expected the path of a profile file, got an empty string");
  write("f", "x");
  EXPECT_HAS(error(path("f") + "/under_a_file.yaml"), "a part of the path is not a folder");
  write("ok.yaml", "name: x\n");
  EXPECT_EQ(*read_input_file(path("ok.yaml"), "profile"), "name: x\n");
}

// Reads `names` as the user nobody when we are root (root reads everything, so permission bits
// only bind an unprivileged user): a forked child drops to uid 65534 and sends each error back.
std::vector<std::string> read_errors_unprivileged(const std::vector<std::string>& names) {
  auto read_all = [&] {
    std::string out;
    for (const auto& n : names) {
      Result<std::string> r = read_input_file(n, "plan");
      out += (r.ok() ? std::string("(read)") : r.error()) + '\n';
    }
    return out;
  };
  std::string text;
  if (::geteuid() != 0) {
    text = read_all();
  } else {
    int fds[2];
    if (::pipe(fds) != 0) return {};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
      const std::string out = read_all();
      const bool ok = ::write(fds[1], out.data(), out.size()) == static_cast<ssize_t>(out.size());
      ::_exit(ok ? 0 : 4);
    }
    ::close(fds[1]);
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the unprivileged child failed: " << status;
  }
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(text.substr(at, nl - at));
  return lines;
}

TEST_F(InputFiles, PermissionProblemsAreOneLine) {
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  write("secret.yaml", "name: x\n");
  fs::permissions(dir_ / "secret.yaml", fs::perms::none);
  fs::create_directory(dir_ / "locked");
  write("locked/p.yaml", "name: x\n");
  fs::permissions(dir_ / "locked", fs::perms::none);
  const auto errors = read_errors_unprivileged({path("secret.yaml"), path("locked/p.yaml")});
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], path("secret.yaml") + ": cannot read the plan file: permission denied");
  EXPECT_EQ(errors[1], path("locked/p.yaml") + ": cannot read the plan file: permission denied");
}

TEST_F(InputFiles, LoadersUseIt) {
  fs::create_directory(dir_ / "d.yaml");
  EXPECT_HAS(load_profile(path("d.yaml")).error(), "d.yaml: is a folder, not a profile file");
  EXPECT_HAS(load_model(path("d.yaml")).error(), "d.yaml: is a folder, not a model file");
  EXPECT_HAS(load_placement(path("d.yaml")).error(), "d.yaml: is a folder, not a placement file");
  // A name that is neither a file nor a built-in still lists the built-ins.
  EXPECT_HAS(load_profile("dgx9").error(), "not a built-in profile (did you mean dgx2?; built-in: dgx-a100");
}

TEST(Units, NonFiniteAndExtremeValuesPrintWithoutUndefinedBehaviour) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(format_bytes(inf), "inf B");
  EXPECT_EQ(format_flops_rate(-std::numeric_limits<double>::quiet_NaN()), "nan FLOPS");
  EXPECT_EQ(format_sig(-inf), "-inf");
  EXPECT_EQ(format_sig(1e300), "1e+300");
  EXPECT_EQ(format_sig(1e-300), "1e-300");
  EXPECT_EQ(format_sig(123.456), "123");
  EXPECT_FALSE(parse_quantity("1e308 TB", Dimension::bytes).ok());
  EXPECT_FALSE(parse_quantity("inf", Dimension::count).ok());
  EXPECT_FALSE(parse_quantity("nan GB/s", Dimension::bandwidth).ok());
  EXPECT_FALSE(parse_hidden("99999999999K").ok());
  EXPECT_FALSE(parse_hidden("2048K").ok());  // above kMaxHidden (1024K)
  EXPECT_EQ(*parse_hidden("1024K"), kMaxHidden);
}

TEST(TrainingConfigChecks, RangesAndSentinels) {
  TrainingConfig c;
  c.bsz = std::numeric_limits<double>::infinity();
  EXPECT_HAS(validate(c, 4).error(), "--bsz: expected a micro-batch per GPU > 0 and at most 65536");
  c = {};
  c.tiling_factor = 1000000;
  EXPECT_HAS(validate(c, 4).error(), "--tiling: expected a tiling factor from 1 to 4096, got 1000000");
  c = {};
  c.dp = 1 << 26;
  c.mp = 1024;
  EXPECT_HAS(validate(c, 4).error(), "--dp/--mp: 67108864 x 1024 GPUs");  // would overflow int downstream
  c = {};
  c.prefetch_depth = 8;  // one layer has 7 parameter groups per pass
  EXPECT_HAS(validate(c, 1).error(), "--prefetch-depth: expected at most 7 for 1 layer(s)");
  c.prefetch_depth = 7;
  EXPECT_TRUE(validate(c, 1).ok());
}

TEST(TrainingConfigChecks, ParallelismFitsTheProfile) {
  HardwareProfile p = *load_profile("dgx2");
  TrainingConfig c;
  c.mp = 3;  // used to run dp 5 x mp 3 = 15 of 16 GPUs
  EXPECT_HAS(fit_to_profile(c, p).error(), "--mp: tensor slicing stays inside a node of 16 GPUs: expected a divisor of 16, got 3");
  c.mp = 4;
  EXPECT_EQ(fit_to_profile(c, p)->dp, 4);
  c.dp = 8;
  EXPECT_HAS(fit_to_profile(c, p).error(), "--dp/--mp: 8 x 4 GPUs asked, profile dgx2 has 16");
}

TEST(TrainingConfigChecks, ScheduleSizeIsBoundedByMemoryWithTheLimitInTheMessage) {
  TrainingConfig c;
  const double gib = 1 << 30;
  EXPECT_TRUE(schedule_size_check(c, 128, 16 * gib).ok());
  c.tiling_factor = 4096;
  Result<TrainingConfig> r = schedule_size_check(c, 128, 16 * gib);
  ASSERT_FALSE(r.ok());
  EXPECT_HAS(r.error(), "--tiling: 4096 makes a schedule of about");
  EXPECT_HAS(r.error(), "this machine's 16.0 GiB memory");
  EXPECT_HAS(r.error(), "(at most ");
  c.tiling_factor = 1;
  EXPECT_HAS(schedule_size_check(c, 100000, 16 * gib).error(), "--layers: 100000 makes a schedule");
  c.micro_batches = 4096;
  EXPECT_HAS(schedule_size_check(c, 100, 1 * gib).error(), "--micro-batches: 4096 makes a schedule");
}

// The estimate validate() refuses work with must stay an upper bound of what build_schedule makes.
TEST(TrainingConfigChecks, ScheduleEstimateBoundsTheRealSchedule) {
  HardwareProfile p = *load_profile("dgx2");
  for (const std::string& name : preset_names()) {
    Placement pl = *preset(name);
    for (int tiling : {1, 4}) {
      ModelSpec m = *model_from_shape(6, 1024, 16);
      TrainingConfig c;
      c.seq = m.seq;
      c.tiling_factor = tiling;
      c.micro_batches = pl.layer_major ? 4 : 1;
      if (name == "three_d") c.mp = 2;
      Result<Schedule> s = build_schedule(m, pl, c, p, 0);
      if (!s) continue;  // tiling needs partitioned parameters
      EXPECT_LE(double(s->steps.size()), estimated_schedule_steps(c, m.layers)) << name << " tiling " << tiling;
    }
  }
}

}  // namespace
}  // namespace memwall
