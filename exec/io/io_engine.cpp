// The engine-independent half of IoEngine: opening files (O_DIRECT or the buffered fallback,
// fallocate), splitting requests into blocks, accounting short transfers and errors, handles.
#include "exec/io/io_engine.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <iostream>
#include <system_error>

#include "exec/io/engine_detail.hpp"
#include "exec/io/user_files.hpp"

namespace memwall::io {

namespace detail {

FileState::~FileState() {
  if (fd >= 0) ::close(fd);
}

std::string call_error(const char* call, int err, const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line) + ": " + call + ": " + std::strerror(err) + " (errno " +
         std::to_string(err) + ")";
}

std::string io_error(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t length,
                     const std::string& what) {
  return std::string(op == IoOp::read ? "read " : "write ") + path + ": offset " + std::to_string(offset) +
         " length " + std::to_string(length) + ": " + what;
}

}  // namespace detail

using detail::Batch;
using detail::FileState;

std::string to_string(EngineKind k) { return k == EngineKind::uring ? "uring" : "psync"; }

Result<EngineKind> parse_engine_kind(const std::string& name) {
  if (name == "uring") return EngineKind::uring;
  if (name == "psync") return EngineKind::psync;
  return make_error("expected uring or psync, got \"" + name + "\"");
}

const std::string& IoFile::path() const { return state_->path; }
bool IoFile::direct() const { return state_->direct; }
int IoFile::fd() const { return state_->fd; }
std::uint64_t IoFile::size_bytes() const {
  struct stat st {};
  return ::fstat(state_->fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

Status IoHandle::wait() const {
  if (!batch_) return make_error("wait on an empty IoHandle");
  std::unique_lock lock(batch_->m);
  batch_->cv.wait(lock, [&] { return batch_->pending == 0; });
  if (!batch_->error.empty()) return make_error(batch_->error);
  return ok_status();
}

bool IoHandle::done() const {
  if (!batch_) return true;
  std::lock_guard lock(batch_->m);
  return batch_->pending == 0;
}

struct IoEngine::Shared {
  std::mutex m;
  std::condition_variable cv;
  std::size_t outstanding = 0;  // chunks submitted and not finished, all batches
  std::string first_error;      // since the last wait_all
  int warnings = 0;
  IoCounters counters;
};

IoEngine::IoEngine(EngineOptions options) : options_(std::move(options)), shared_(std::make_unique<Shared>()) {}
IoEngine::~IoEngine() = default;

Status IoEngine::register_buffers(std::span<const iovec>) { return ok_status(); }

IoCounters IoEngine::counters() const {
  std::lock_guard lock(shared_->m);
  return shared_->counters;
}

int IoEngine::warnings_issued() const {
  std::lock_guard lock(shared_->m);
  return shared_->warnings;
}

void IoEngine::warn_once(const std::string& message) {
  {
    std::lock_guard lock(shared_->m);
    if (shared_->warnings > 0) return;
    shared_->warnings = 1;
  }
  if (options_.warn)
    options_.warn(message);
  else
    std::cerr << message << "\n";
}

Result<IoFile> IoEngine::open(const std::string& path, const OpenOptions& how) {
  // A file this engine makes is made without following a link at its place (user_files.hpp); a
  // truncated one is a new file, so nothing else's bytes are cut.
  if (how.truncate) {
    Result<int> made = create_new_file(path, Existing::replace, O_RDWR);
    if (!made) return make_error("open " + made.error());
    ::close(*made);
  }
  int flags = O_RDWR | O_CLOEXEC | (how.create || how.truncate ? O_CREAT | O_NOFOLLOW : 0);
  auto state = std::make_shared<FileState>();
  state->path = path;
  std::string why_buffered;
  if (options_.direct) {
    state->fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (state->fd < 0 && errno == EINVAL) why_buffered = "the filesystem refuses O_DIRECT";
    if (state->fd >= 0) {
      // tmpfs and ramfs accept O_DIRECT (Linux >= 6.6) but keep data in the page cache: calling
      // that direct I/O would make benchmark numbers lie, so treat it as buffered and say so.
      struct statfs fs {};
      if (::fstatfs(state->fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
        why_buffered = "tmpfs/ramfs keeps files in the page cache, so O_DIRECT is not direct there";
        if (::fcntl(state->fd, F_SETFL, ::fcntl(state->fd, F_GETFL) & ~O_DIRECT) != 0)
          return make_error("open " + path + ": fcntl(clear O_DIRECT): " + std::strerror(errno));
      } else {
        state->direct = true;
      }
    }
  }
  if (state->fd < 0) state->fd = ::open(path.c_str(), flags, 0644);
  if (state->fd < 0 && errno == ELOOP && (flags & O_NOFOLLOW)) {
    Result<bool> link = refuse_link(path);
    return make_error("open " + (link ? path + ": " + std::strerror(ELOOP) : link.error()));
  }
  if (state->fd < 0) return make_error("open " + path + ": " + std::strerror(errno));
  if (!why_buffered.empty())
    warn_once("memwall io: warning: " + path + ": " + why_buffered +
              "; using buffered I/O (page cache) for files this engine opens there");
  if (how.preallocate_bytes > 0) {
    int rc = ::fallocate(state->fd, 0, 0, static_cast<off_t>(how.preallocate_bytes));
    if (rc != 0)
      return make_error("fallocate " + path + ": offset 0 length " + std::to_string(how.preallocate_bytes) + ": " +
                        std::strerror(errno));
  }
  IoFile f;
  f.state_ = std::move(state);
  return f;
}

IoHandle IoEngine::read(const IoFile& f, std::uint64_t offset, void* buf, std::size_t length) {
  IoRequest r{IoOp::read, f, offset, buf, length};
  return submit({&r, 1});
}

IoHandle IoEngine::write(const IoFile& f, std::uint64_t offset, const void* buf, std::size_t length) {
  // The engine never writes into `buf` for a write; the request type is shared with reads.
  IoRequest r{IoOp::write, f, offset, const_cast<void*>(buf), length};
  return submit({&r, 1});
}

IoHandle IoEngine::submit(std::span<const IoRequest> requests) {
  IoHandle h;
  h.batch_ = std::make_shared<Batch>();
  std::vector<Chunk*> chunks;
  std::string invalid;
  for (const IoRequest& r : requests) {
    if (!r.file.state_) {
      invalid = "request on an IoFile that was never opened";
      break;
    }
    const FileState& fs = *r.file.state_;
    if (fs.direct && (r.offset % kIoAlignment || r.length % kIoAlignment ||
                      reinterpret_cast<std::uintptr_t>(r.buf) % kIoAlignment)) {
      invalid = detail::io_error(r.op, fs.path, r.offset, r.length,
                                 "O_DIRECT needs offset, length and buffer address aligned to " +
                                     std::to_string(kIoAlignment) + " bytes");
      break;
    }
    if (options_.verify && (r.offset % kIoAlignment || r.length % kIoAlignment)) {
      invalid = detail::io_error(r.op, fs.path, r.offset, r.length,
                                 "verify checks whole blocks: offset and length must be multiples of " +
                                     std::to_string(kIoAlignment) + " bytes");
      break;
    }
    std::size_t block = std::max<std::size_t>(options_.block_bytes, kIoAlignment);
    for (std::size_t at = 0; at < r.length; at += block) {
      std::size_t n = std::min(block, r.length - at);
      chunks.push_back(new Chunk{h.batch_, r.file.state_, r.op, r.offset + at, static_cast<char*>(r.buf) + at, n});
    }
  }
  if (!invalid.empty()) {
    for (Chunk* c : chunks) delete c;
    h.batch_->error = invalid;
    std::lock_guard lock(shared_->m);
    if (shared_->first_error.empty()) shared_->first_error = invalid;
    return h;
  }
  if (chunks.empty()) return h;
  h.batch_->pending = chunks.size();
  {
    std::lock_guard lock(shared_->m);
    shared_->outstanding += chunks.size();
  }
  enqueue(chunks);
  return h;
}

void IoEngine::account_done(IoOp op, std::size_t bytes, const std::string* error, std::size_t verified) {
  std::lock_guard lock(shared_->m);
  if (error && shared_->first_error.empty()) shared_->first_error = *error;
  if (error) ++shared_->counters.errors;
  else (op == IoOp::read ? shared_->counters.bytes_read : shared_->counters.bytes_written) += bytes;
  shared_->counters.bytes_verified += verified;
}

void IoEngine::finish(Chunk* c, std::string error) {
  std::shared_ptr<Batch> b = std::move(c->batch);
  const IoOp op = c->op;
  const std::size_t bytes = c->length;
  const std::size_t verified = options_.verify && op == IoOp::read && error.empty() ? bytes : 0;
  delete c;
  // Counters, then the batch, then the engine-wide outstanding count: a caller that reads
  // counters() right after its wait() returns sees this chunk counted (the verify test once saw 7
  // of 8 chunks), and after wait_all() every batch is done.
  account_done(op, bytes, error.empty() ? nullptr : &error, verified);
  {
    std::lock_guard lock(b->m);
    if (!error.empty() && b->error.empty()) b->error = error;
    if (--b->pending == 0) b->cv.notify_all();
  }
  std::lock_guard lock(shared_->m);
  if (--shared_->outstanding == 0) shared_->cv.notify_all();
}

namespace {

// A 64-bit checksum of one 4 KiB block (8-byte words, multiply-xorshift mixing; never 0, which
// marks a block never written). Four independent lanes, folded at the end, so the multiplies
// overlap instead of waiting on each other: one lane ran at ~1.6 GB/s on the engine's thread and
// halved io-bench's bandwidth with --verify (bench/io).
std::uint64_t block_sum(const char* p) {
  std::uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull, 0x27d4eb2f165667c5ull};
  for (std::size_t i = 0; i < kIoAlignment; i += 32)
    for (std::size_t l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * 0xbf58476d1ce4e5b9ull;
      h[l] ^= h[l] >> 31;
    }
  std::uint64_t x = h[0];
  for (std::size_t l = 1; l < 4; ++l) {
    x = (x ^ h[l]) * 0x94d049bb133111ebull;
    x ^= x >> 29;
  }
  return x == 0 ? 1 : x;
}

}  // namespace

std::string IoEngine::verify_chunk(const Chunk& c) {
  const FileState& fs = *c.file;
  const std::uint64_t first = c.offset / kIoAlignment, blocks = c.length / kIoAlignment;
  std::vector<std::uint64_t> sums(blocks);
  for (std::uint64_t b = 0; b < blocks; ++b) sums[b] = block_sum(c.buf + b * kIoAlignment);
  std::lock_guard lock(fs.verify_m);
  if (c.op == IoOp::write) {
    if (fs.block_sums.size() < first + blocks) fs.block_sums.resize(first + blocks, 0);
    std::copy(sums.begin(), sums.end(), fs.block_sums.begin() + std::ptrdiff_t(first));
    return {};
  }
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t want = first + b < fs.block_sums.size() ? fs.block_sums[first + b] : 0;
    if (want == sums[b]) continue;
    const std::uint64_t at = (first + b) * kIoAlignment;
    char what[160];
    if (want == 0)
      std::snprintf(what, sizeof what, "verify: this block was never written by this run");
    else
      std::snprintf(what, sizeof what,
                    "verify: the bytes read differ from those written (checksum %016llx, written %016llx)",
                    static_cast<unsigned long long>(sums[b]), static_cast<unsigned long long>(want));
    return detail::io_error(c.op, fs.path, at, kIoAlignment, what);
  }
  return {};
}

IoEngine::Outcome IoEngine::on_result(Chunk* c, long res) {
  const std::uint64_t at = c->offset + c->done;
  const std::uint64_t left = c->length - c->done;
  if (options_.inject) res = options_.inject(c->op, c->file->path, at, left, res);
  if (res == -EAGAIN || res == -EINTR) return Outcome::again;
  if (res < 0) {
    finish(c, detail::io_error(c->op, c->file->path, at, left, std::strerror(static_cast<int>(-res))));
    return Outcome::failed;
  }
  struct stat st {};
  if (res == 0) {
    if (c->op == IoOp::read) {
      ::fstat(c->file->fd, &st);
      finish(c, detail::io_error(c->op, c->file->path, at, left,
                                 "past the end of the file (" + std::to_string(st.st_size) + " bytes)"));
    } else {
      finish(c, detail::io_error(c->op, c->file->path, at, left, "the kernel wrote 0 bytes"));
    }
    return Outcome::failed;
  }
  c->done += static_cast<std::size_t>(res);
  if (c->done >= c->length) return Outcome::transferred;
  // Short transfer. A short read at the end of the file is the end of the file, not a reason to
  // re-issue a misaligned O_DIRECT read that would fail with EINVAL.
  if (c->op == IoOp::read && ::fstat(c->file->fd, &st) == 0 &&
      c->offset + c->done >= static_cast<std::uint64_t>(st.st_size)) {
    finish(c, detail::io_error(c->op, c->file->path, c->offset + c->done, c->length - c->done,
                               "past the end of the file (" + std::to_string(st.st_size) + " bytes)"));
    return Outcome::failed;
  }
  return Outcome::again;
}

void IoEngine::complete(Chunk* c) { finish(c, options_.verify ? verify_chunk(*c) : std::string()); }

Status IoEngine::wait_all() {
  std::unique_lock lock(shared_->m);
  shared_->cv.wait(lock, [&] { return shared_->outstanding == 0; });
  std::string e = std::move(shared_->first_error);
  shared_->first_error.clear();
  if (!e.empty()) return make_error(e);
  return ok_status();
}

Result<std::unique_ptr<IoEngine>> make_engine(EngineKind kind, const EngineOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 4096)
    return make_error("queue depth: expected 1 to 4096, got " + std::to_string(options.queue_depth));
  if (options.rings == 0 || options.rings > 64)
    return make_error("rings: expected 1 to 64, got " + std::to_string(options.rings));
  // One io_uring read/write carries a 32-bit length; Linux moves at most ~2 GiB per call anyway.
  if (options.block_bytes == 0 || options.block_bytes % kIoAlignment || options.block_bytes > (1u << 30))
    return make_error("block size: expected a multiple of 4096 bytes up to 1 GiB, got " +
                      std::to_string(options.block_bytes));
  try {
    if (kind == EngineKind::psync) return detail::make_psync_engine(options);
    std::string error;
    std::unique_ptr<IoEngine> e = detail::make_uring_engine(options, &error);
    if (!e) return make_error(error);
    return e;
  } catch (const std::system_error& e) {  // a worker thread could not start
    return make_error(std::string(kind == EngineKind::psync ? "psync engine: cannot start " : "uring engine: cannot start ") +
                      std::to_string(kind == EngineKind::psync ? options.queue_depth : options.rings) +
                      (kind == EngineKind::psync ? " threads (one per queue slot): " : " ring threads: ") +
                      e.code().message());
  }
}

}  // namespace memwall::io
