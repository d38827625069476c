// Files memwall makes in a user's folders (swap files, checkpoints, traces, outputs), made so that
// other processes, other runs and planted files cannot turn a run into damage (issue 30):
//  - FolderLock: a run holds an exclusive lock on each folder it writes into for its whole life
//    (one lock file per rank, flock(2)); a second run is refused at once with the holder's pid. The
//    kernel drops a dead process's lock, so a stale lock file is simply taken over.
//  - create_new_file: a file is created, never opened through a symbolic link and never truncated:
//    a symlink (or anything but a regular file) at its place is refused naming the path; a regular
//    file left there is replaced only when the caller says the name is its own (a swap file or a
//    temporary of a run killed before it could clean up, in a folder this run has locked).
//  - Folder: a folder opened once and written through openat/renameat (its sub-folders opened with
//    O_NOFOLLOW), so a folder swapped for a link after the check changes nothing.
// Thread-safety: value types; a FolderLock is owned by one thread.
#pragma once

#include <fcntl.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "model/result.hpp"

namespace memwall::io {

class TempFileGuard;

class FolderLock {
 public:
  // Locks `dir` (which must exist) for this rank: `flag` names the option the folder came from
  // (--nvme-dir, --save) in the error.
  static Result<FolderLock> acquire(const std::string& dir, int rank, std::string_view flag);
  FolderLock() = default;
  FolderLock(FolderLock&& o) noexcept;
  FolderLock& operator=(FolderLock&& o) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();
  const std::string& path() const { return path_; }  // the lock file

 private:
  void release();
  int fd_ = -1;
  std::string path_;
  std::unique_ptr<TempFileGuard> guard_;
};

// What to do about a regular file already at the path.
enum class Existing { refuse, replace };

// A folder opened without following links: every file made in it is made relative to it.
class Folder {
 public:
  // Opens `dir`, a folder the user named (a link there is followed: a scratch folder pointing at
  // the drive); a non-folder is refused, the message naming `flag` and `dir`.
  static Result<Folder> open(const std::string& dir, std::string_view flag);
  Folder() = default;
  Folder(Folder&& o) noexcept;
  Folder& operator=(Folder&& o) noexcept;
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  ~Folder();
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

  // Makes sub-folder `name` (or opens it when it is a folder already; a link is refused). Sets
  // *made when this call made it.
  Result<Folder> make_folder(const std::string& name, bool* made = nullptr) const;
  // Creates file `name` (`flags` | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode 0644); returns
  // its descriptor.
  Result<int> create_file(const std::string& name, Existing existing, int flags = O_WRONLY) const;
  // Renames `from` to `to` inside this folder; `to` may not be a link (a link is refused, not
  // replaced), then fsyncs the folder.
  Result<bool> replace(const std::string& from, const std::string& to) const;
  // Removes file `name` (quietly when it is gone).
  void remove(const std::string& name) const;

 private:
  Folder(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// create_new_file(path, ...): Folder::open(parent).create_file(name, ...), for one-off files.
Result<int> create_new_file(const std::string& path, Existing existing, int flags = O_WRONLY);

// Refuses a symbolic link at `path` ("PATH: is a symbolic link; ..."); true when there is none.
Result<bool> refuse_link(const std::string& path);

// Output files (reports, traces, exports) a command writes where the user says.
// Before any work: `path` can be written: its folder exists and takes a new file, and it is neither
// a folder nor a link. The error starts with the path.
Result<bool> check_output_file(const std::string& path);
// Before any work: folder `path` exists or is made (its parent must exist) and takes new files.
Result<bool> make_output_folder(const std::string& path);
// Writes `bytes` to `path` through a temporary file beside it (made new, never through a link) and
// a rename, so a failure (a full disk, a signal) leaves neither a half-written file nor the
// temporary. The error names the path and, for a failed write, the offset.
Result<bool> write_output_file(const std::string& path, std::string_view bytes);

}  // namespace memwall::io
