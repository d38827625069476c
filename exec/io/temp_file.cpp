#include "exec/io/temp_file.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>

namespace memwall::io {
namespace {

// A signal handler may only touch lock-free atomics and plain memory it reads without locks: each
// slot's path is written before its flag is set (release) and read after the flag (acquire).
struct Slot {
  std::atomic<int> armed{0};
  char path[4096];
};
Slot g_slots[kMaxGuardedFiles];
static_assert(std::atomic<int>::is_always_lock_free);

constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
std::mutex g_m;           // guards the fields below and slot claiming; never taken in the handler
int g_live = 0;           // guards holding a slot
struct sigaction g_old[3];

extern "C" void remove_guarded_and_reraise(int sig) {
  for (Slot& s : g_slots)
    if (s.armed.load(std::memory_order_acquire)) ::unlink(s.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

TempFileGuard::TempFileGuard(std::string path) : path_(std::move(path)) {
  if (path_.size() >= sizeof g_slots[0].path) return;
  std::lock_guard lock(g_m);
  for (int i = 0; i < int(kMaxGuardedFiles); ++i) {
    Slot& s = g_slots[i];
    if (s.armed.load(std::memory_order_relaxed)) continue;
    std::memcpy(s.path, path_.c_str(), path_.size() + 1);
    s.armed.store(1, std::memory_order_release);
    slot_ = i;
    break;
  }
  if (slot_ < 0 || g_live++ > 0) return;
  struct sigaction sa {};
  sa.sa_handler = remove_guarded_and_reraise;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &g_old[i]);
}

TempFileGuard::~TempFileGuard() {
  std::error_code ec;  // a folder gone or read-only by now: nothing left to remove
  std::filesystem::remove(path_, ec);
  if (slot_ < 0) return;
  std::lock_guard lock(g_m);
  g_slots[slot_].armed.store(0, std::memory_order_release);
  if (--g_live == 0)
    for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &g_old[i], nullptr);
}

}  // namespace memwall::io
