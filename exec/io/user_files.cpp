#include "exec/io/user_files.hpp"

#include "exec/io/temp_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace memwall::io {
namespace {

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string link_refusal(const std::string& path) {
  return path + ": is a symbolic link; memwall does not write through links (remove it, or choose another folder)";
}

// An output is written to a new file and renamed over its name: a device, FIFO or socket there
// (/dev/null as root) would be replaced by a regular file, so it is refused.
std::string not_a_file_refusal(const std::string& path) {
  return path + ": is a device, FIFO or socket; memwall writes its outputs as regular files (name a file)";
}

// What is at `name` in folder `dir_fd`, without following a link: 0 when nothing is there.
Result<mode_t> kind_at(int dir_fd, const std::string& path, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return st.st_mode & S_IFMT;
  if (errno == ENOENT) return mode_t(0);
  return make_error(path + ": " + std::strerror(errno));
}

}  // namespace

// ---- FolderLock ----

Result<FolderLock> FolderLock::acquire(const std::string& dir, int rank, std::string_view flag) {
  Result<Folder> folder = Folder::open(dir, flag);
  if (!folder) return make_error(folder.error());
  char name[40];
  std::snprintf(name, sizeof name, ".memwall-lock-rank%04d", rank);
  FolderLock lock;
  lock.path_ = join(dir, name);
  // A lock file another process unlinks as it ends may be the one we locked: then lock the new one.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::openat(folder->fd(), name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (errno == ELOOP) return make_error(std::string(flag) + " " + link_refusal(lock.path_));
      return make_error(std::string(flag) + " " + dir + ": not writable (cannot make the lock file " + lock.path_ +
                        ": " + std::strerror(errno) + ")");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char holder[64] = {};
      const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
      ::close(fd);
      if (err != EWOULDBLOCK)
        return make_error(std::string(flag) + " " + dir + ": cannot lock " + lock.path_ + ": " + std::strerror(err));
      std::string pid = n > 0 ? std::string(holder, std::size_t(n)) : "unknown";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      return make_error(std::string(flag) + " " + dir + ": in use by another memwall run (pid " + pid +
                        "); give each run its own folder, or wait for that run to end");
    }
    struct stat held {}, now {};
    if (::fstat(fd, &held) == 0 && ::fstatat(folder->fd(), name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
        held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      // the pid is for the message a second run prints; the lock holds without it (a full drive)
      if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size())) (void)::ftruncate(fd, 0);
      lock.fd_ = fd;
      // removed on SIGINT/SIGTERM/SIGHUP too (unlinked while still held: safe, see above)
      lock.guard_ = std::make_unique<TempFileGuard>(lock.path_);
      return lock;
    }
    ::close(fd);  // unlinked or replaced under us: try again
  }
  return make_error(std::string(flag) + " " + dir + ": its lock file " + lock.path_ + " keeps changing (another process?)");
}

FolderLock::FolderLock(FolderLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), guard_(std::move(o.guard_)) {
  o.fd_ = -1;
}

FolderLock& FolderLock::operator=(FolderLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    guard_ = std::move(o.guard_);
    o.fd_ = -1;
  }
  return *this;
}

FolderLock::~FolderLock() { release(); }

void FolderLock::release() {
  if (fd_ < 0) return;
  guard_.reset();  // unlinks it while still locked: a waiter that opened it retries on the new file
  ::close(fd_);
  fd_ = -1;
}

// ---- Folder ----

Result<Folder> Folder::open(const std::string& dir, std::string_view flag) {
  // The folder the user named may be a link (a scratch folder pointing at the drive): followed.
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const std::string who = flag.empty() ? dir : std::string(flag) + " " + dir;
    if (errno == ENOTDIR) return make_error(who + ": not a folder");
    return make_error(who + ": " + std::strerror(errno));
  }
  return Folder(fd, dir);
}

Folder::Folder(Folder&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

Folder& Folder::operator=(Folder&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

Folder::~Folder() {
  if (fd_ >= 0) ::close(fd_);
}

Result<Folder> Folder::make_folder(const std::string& name, bool* made) const {
  const std::string path = join(path_, name);
  const bool new_one = ::mkdirat(fd_, name.c_str(), 0755) == 0;
  if (!new_one && errno != EEXIST) return make_error(path + ": cannot make the folder: " + std::strerror(errno));
  if (made) *made = new_one;
  Result<mode_t> kind = kind_at(fd_, path, name);
  if (!kind) return make_error(kind.error());
  if (*kind == S_IFLNK) return make_error(link_refusal(path));
  const int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) return make_error(link_refusal(path));
    if (errno == ENOTDIR) return make_error(path + ": exists and is not a folder");
    return make_error(path + ": " + std::strerror(errno));
  }
  return Folder(fd, path);
}

Result<int> Folder::create_file(const std::string& name, Existing existing, int flags) const {
  const std::string path = join(path_, name);
  Result<mode_t> kind = kind_at(fd_, path, name);
  if (!kind) return make_error(kind.error());
  if (*kind == S_IFLNK) return make_error(link_refusal(path));
  if (*kind != 0 && *kind != S_IFREG) return make_error(path + ": exists and is not a regular file");
  if (*kind == S_IFREG) {
    if (existing == Existing::refuse)
      return make_error(path + ": exists; memwall does not overwrite a file it did not make (remove it, or choose another name)");
    if (::unlinkat(fd_, name.c_str(), 0) != 0 && errno != ENOENT)
      return make_error(path + ": cannot replace the file left there: " + std::strerror(errno));
  }
  const int fd = ::openat(fd_, name.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0) return fd;
  if (errno == ELOOP) return make_error(link_refusal(path));
  if (errno == EEXIST) return make_error(path + ": appeared while memwall was making it (another process writes in this folder)");
  return make_error(path + ": " + std::strerror(errno));
}

Result<bool> Folder::replace(const std::string& from, const std::string& to) const {
  Result<mode_t> kind = kind_at(fd_, join(path_, to), to);
  if (!kind) return make_error(kind.error());
  if (*kind == S_IFLNK) return make_error(link_refusal(join(path_, to)));
  if (*kind == S_IFDIR) return make_error(join(path_, to) + ": is a folder, expected a file name to write");
  if (*kind != 0 && *kind != S_IFREG)
    return make_error(not_a_file_refusal(join(path_, to)));
  if (::renameat(fd_, from.c_str(), fd_, to.c_str()) != 0)
    return make_error("rename " + join(path_, from) + " -> " + join(path_, to) + ": " + std::strerror(errno));
  ::fsync(fd_);
  return true;
}

void Folder::remove(const std::string& name) const { ::unlinkat(fd_, name.c_str(), 0); }

Result<int> create_new_file(const std::string& path, Existing existing, int flags) {
  const std::filesystem::path p(path);
  const std::string parent = p.has_parent_path() ? p.parent_path().string() : ".";
  if (const int probe = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); probe < 0)
    return make_error(path + ": " + std::strerror(errno));
  else
    ::close(probe);
  Result<Folder> f = Folder::open(parent, "");
  if (!f) return make_error(f.error());
  return f->create_file(p.filename().string(), existing, flags);
}

Result<bool> refuse_link(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return make_error(link_refusal(path));
  return true;
}

namespace {

// The temporary an output is written to, beside it (same filesystem, so the rename is atomic) and
// named so no user file is hit.
std::string temp_name(const std::string& name) { return name + ".memwall-" + std::to_string(::getpid()) + ".tmp"; }

struct OutputPlace {
  Folder folder;
  std::string name;  // the file's name in `folder`
};

Result<OutputPlace> output_place(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(path, ec))) return make_error(path + ": is a folder, expected a file name to write");
  if (Result<bool> link = refuse_link(path); !link) return make_error(link.error());
  if (const fs::file_status st = fs::symlink_status(path, ec); fs::exists(st) && !fs::is_regular_file(st))
    return make_error(not_a_file_refusal(path));
  const fs::path p(path);
  const std::string parent = p.has_parent_path() ? p.parent_path().string() : ".";
  if (!fs::is_directory(parent, ec))
    return make_error(path + ": its folder " + parent + " does not exist (make it first)");
  Result<Folder> f = Folder::open(parent, "");
  if (!f) return make_error(f.error());  // names the folder
  return OutputPlace{std::move(f).value(), p.filename().string()};
}

// "DIR/NAME: reason" from create_file becomes "reason" (the caller names the path it was asked for).
std::string reason(const std::string& error, const std::string& made) {
  return error.rfind(made + ": ", 0) == 0 ? error.substr(made.size() + 2) : error;
}

// Whether `folder` takes a new file: makes `name` there and removes it. The error is the reason.
Result<bool> takes_new_files(const Folder& folder, const std::string& name) {
  const TempFileGuard guard(join(folder.path(), name));  // also on a signal between the two
  Result<int> fd = folder.create_file(name, Existing::replace);
  if (!fd) return make_error(reason(fd.error(), join(folder.path(), name)));
  ::close(*fd);
  folder.remove(name);
  return true;
}

}  // namespace

Result<bool> check_output_file(const std::string& path) {
  Result<OutputPlace> at = output_place(path);
  if (!at) return make_error(at.error());
  if (Result<bool> ok = takes_new_files(at->folder, temp_name(at->name)); !ok)
    return make_error(path + ": cannot be written (" + ok.error() + ")");
  return true;
}

Result<bool> make_output_folder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (path.empty()) return make_error("expected a folder, got an empty name");
  if (!fs::exists(fs::symlink_status(p, ec))) {
    const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if (!fs::is_directory(parent, ec))
      return make_error(path + ": its folder " + parent.string() + " does not exist (make it first)");
    if (!fs::create_directory(p, ec) && !fs::is_directory(p))
      return make_error(path + ": cannot make the folder: " + ec.message());
  }
  if (!fs::is_directory(p, ec)) return make_error(path + ": not a folder");
  Result<Folder> f = Folder::open(path, "");
  if (!f) return make_error(f.error());
  if (Result<bool> ok = takes_new_files(*f, ".memwall-probe-" + std::to_string(::getpid())); !ok)
    return make_error(path + ": not writable (" + ok.error() + ")");
  return true;
}

Result<bool> write_output_file(const std::string& path, std::string_view bytes) {
  Result<OutputPlace> at = output_place(path);
  if (!at) return make_error(at.error());
  const std::string tmp = temp_name(at->name);
  const TempFileGuard guard(join(at->folder.path(), tmp));  // removed unless renamed, also on a signal
  Result<int> fd = at->folder.create_file(tmp, Existing::replace);
  if (!fd) return make_error(path + ": cannot open for writing: " + reason(fd.error(), join(at->folder.path(), tmp)));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(*fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string e = w == 0 ? "no progress" : std::strerror(errno);
      ::close(*fd);
      return make_error(path + ": write failed at offset " + std::to_string(done) + ": " + e);
    }
    done += std::size_t(w);
  }
  if (::close(*fd) != 0) return make_error(path + ": write failed: " + std::strerror(errno));
  if (Result<bool> r = at->folder.replace(tmp, at->name); !r) return make_error(path + ": cannot write: " + r.error());
  return true;
}

}  // namespace memwall::io
