// TempFileGuard: files are removed when the guard ends and when the process is killed by SIGINT,
// SIGTERM or SIGHUP while a guard lives; the process still dies of that signal; earlier handlers
// come back after the last guard.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "exec/io/temp_file.hpp"
#include "tests/exec/io/test_support.hpp"

namespace memwall::io {
namespace {

bool exists(const std::string& p) { return std::filesystem::exists(p); }
void touch(const std::string& p) { std::ofstream(p) << "x"; }

TEST(TempFileGuard, RemovesTheFileWhenItEnds) {
  testing::ScratchDir dir;
  const std::string p = dir.file("a.tmp");
  {
    TempFileGuard g(p);
    EXPECT_TRUE(g.signal_safe());
    touch(p);
    EXPECT_TRUE(exists(p));
  }
  EXPECT_FALSE(exists(p));
  { TempFileGuard never_made(dir.file("never")); }  // a file that was never made is no error
}

// The child guards two files (one of them not yet created when it registers) and one that it
// renames away, then is killed; the parent sees it die of the signal and nothing left.
void killed_by(int sig) {
  testing::ScratchDir dir;
  const std::string a = dir.file("a.tmp"), b = dir.file("b.tmp"), kept = dir.file("kept");
  int ready[2];
  ASSERT_EQ(0, ::pipe(ready));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    TempFileGuard ga(a), gb(b);
    touch(a);
    touch(b);
    touch(kept);  // not guarded: must survive
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  char c;
  ASSERT_EQ(1, ::read(ready[0], &c, 1));
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_TRUE(exists(a) && exists(b));
  ::kill(pid, sig);
  int status = 0;
  ASSERT_EQ(pid, ::waitpid(pid, &status, 0));
  EXPECT_TRUE(WIFSIGNALED(status)) << "the process must still die of the signal";
  if (WIFSIGNALED(status)) {
    EXPECT_EQ(WTERMSIG(status), sig);
  }
  EXPECT_FALSE(exists(a)) << strsignal(sig);
  EXPECT_FALSE(exists(b)) << strsignal(sig);
  EXPECT_TRUE(exists(kept));
}

TEST(TempFileGuard, SigtermRemovesGuardedFiles) { killed_by(SIGTERM); }
TEST(TempFileGuard, SigintRemovesGuardedFiles) { killed_by(SIGINT); }
TEST(TempFileGuard, SighupRemovesGuardedFiles) { killed_by(SIGHUP); }

TEST(TempFileGuard, EarlierHandlerComesBackAfterTheLastGuard) {
  testing::ScratchDir dir;
  struct sigaction before {};
  ASSERT_EQ(0, ::sigaction(SIGTERM, nullptr, &before));
  {
    TempFileGuard g1(dir.file("1")), g2(dir.file("2"));
    struct sigaction during {};
    ::sigaction(SIGTERM, nullptr, &during);
    EXPECT_NE(during.sa_handler, before.sa_handler);
  }
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(TempFileGuard, MoreFilesThanSlotsAreStillRemovedAtTheEnd) {
  testing::ScratchDir dir;
  std::vector<std::unique_ptr<TempFileGuard>> gs;
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < kMaxGuardedFiles + 3; ++i) {
    paths.push_back(dir.file("f" + std::to_string(i)));
    gs.push_back(std::make_unique<TempFileGuard>(paths.back()));
    touch(paths.back());
  }
  EXPECT_TRUE(gs.front()->signal_safe());
  EXPECT_FALSE(gs.back()->signal_safe());
  gs.clear();
  for (const std::string& p : paths) EXPECT_FALSE(exists(p)) << p;
  TempFileGuard again(dir.file("again"));  // the slots are free again
  EXPECT_TRUE(again.signal_safe());
}

}  // namespace
}  // namespace memwall::io
