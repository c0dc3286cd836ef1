#include "kernels/io/atomic_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>

#include <zshard/error.h>

namespace zshard {

namespace fs = std::filesystem;

namespace {

// Unique per process and per file, so that ranks or threads writing beside each other never collide.
std::string temp_name(const std::string& path) {
  static std::atomic<unsigned> serial{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
}

// Opens a dead file at `path` for writing over and moves it to `tmp`; -1 when there is none, or it is not
// a plain file of one link (checked on what was opened, so a link made in between is not written through).
int take_over(const std::string& path, const std::string& tmp) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);  // a FIFO would block
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 ||
      std::rename(path.c_str(), tmp.c_str()) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool is_special_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  return !ec && fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st);
}

// The kernel's fs.protected_symlinks, which a link followed here by name would bypass: in a sticky,
// world-writable directory (/tmp) a link is followed only when its owner is this user or the directory's.
void check_link_owner(const fs::path& link, const std::string& path) {
  struct stat l {}, dir {};
  const fs::path parent = link.has_parent_path() ? link.parent_path() : fs::path(".");
  if (::lstat(link.c_str(), &l) != 0 || ::stat(parent.c_str(), &dir) != 0) return;
  const bool shared = (dir.st_mode & S_ISVTX) && (dir.st_mode & S_IWOTH);
  if (shared && l.st_uid != ::geteuid() && l.st_uid != dir.st_uid)
    fail(path, ": cannot write (", link.string(), " is another user's link in the shared directory ", parent.string(),
         ")");
}

// Opens a file written in place. This process's stdout or stderr (/dev/stdout, or the file either is
// redirected to) is written through that descriptor, after what the streams hold: a file of its own
// would have an offset of its own, and the two would write over each other. Anything else is appended
// to. A FIFO that no process reads fails at once (ENXIO) rather than blocking before any collective,
// where no deadline reaches it.
int open_in_place(const std::string& path) {
  struct stat target {}, standard {};
  if (::stat(path.c_str(), &target) == 0)
    for (int out : {STDOUT_FILENO, STDERR_FILENO})
      if (::fstat(out, &standard) == 0 && standard.st_dev == target.st_dev && standard.st_ino == target.st_ino) {
        std::cout.flush();
        std::fflush(nullptr);
        const int fd = ::fcntl(out, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) fail(path, ": cannot write (", std::strerror(errno), ")");
        return fd;
      }
  const int fd = open_for_writing(path, O_APPEND);
  if (fd < 0) fail(path, ": cannot write (", open_error(path, errno), ")");
  return fd;
}

}  // namespace

AtomicFile::AtomicFile(std::string path, Existing existing) : path_(std::move(path)) {
  std::error_code ec;
  if (fs::is_directory(path_, ec)) fail(path_, ": cannot write (it is a directory)");
  // A dead file given up is taken over under its own name only: a link to it is replaced as a link.
  const std::optional<std::string> replaced = existing == Existing::replace ? replaced_file(path_) : path_;
  if (!replaced) {
    fd_ = open_in_place(path_);
    return;
  }
  target_ = *replaced;
  tmp_ = temp_name(target_);
  if (existing == Existing::overwrite) fd_ = take_over(target_, tmp_);
  taken_over_ = fd_ >= 0;
  if (fd_ < 0) fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, ": cannot write (", std::strerror(errno), ")");
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;  // committed, or already cleaned up
  ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail_with_errno(const char* action, int err) {
  ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  fail(path_, ": cannot ", action, " (", std::strerror(err), ")");
}

void AtomicFile::write(const void* data, size_t bytes) {
  ZS_CHECK(fd_ >= 0, path_, ": written after commit or failure");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Only a file written in place can be a pipe; the extra system calls stay off checkpoint writes.
    const ssize_t put = tmp_.empty() ? write_without_sigpipe(fd_, p, bytes) : ::write(fd_, p, bytes);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) fail_with_errno("write", put < 0 ? errno : ENOSPC);
    p += put;
    bytes -= size_t(put);
  }
}

void AtomicFile::commit() {
  ZS_CHECK(fd_ >= 0, path_, ": committed twice or after a failure");
  if (tmp_.empty()) {  // written in place: a device or a pipe has nothing to make durable or rename
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail(path_, ": cannot write (", std::strerror(errno), ")");
    return;
  }
  // A file written over may have been longer: it ends where the writes did.
  if (taken_over_) {
    const off_t end = ::lseek(fd_, 0, SEEK_CUR);
    if (end < 0 || ::ftruncate(fd_, end) != 0) fail_with_errno("write", errno);
  }
  // Delayed allocation can report a full disk only here, at fsync or close.
  if (::fsync(fd_) != 0) fail_with_errno("write", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0 || std::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail(path_, ": cannot write (", std::strerror(err), ")");
  }
  sync_dir(parent_dir(target_));  // the rename is durable once the directory is
}

int open_for_writing(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | flags, 0644);
  if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string open_error(const std::string& path, int err) {
  struct stat st {};
  if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) return "a FIFO that no process reads";
  return std::strerror(err);
}

ssize_t write_without_sigpipe(int fd, const void* data, size_t bytes) {
  sigset_t pipe_signal, old_mask, pending;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, &old_mask);
  sigpending(&pending);
  const bool raised_before = sigismember(&pending, SIGPIPE) == 1;
  const ssize_t put = ::write(fd, data, bytes);
  const int err = errno;
  if (put < 0 && err == EPIPE && !raised_before) {
    // Blocked, the SIGPIPE this write raised is pending on this thread: take it before unblocking.
    const timespec no_wait{};
    sigtimedwait(&pipe_signal, nullptr, &no_wait);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  errno = err;
  return put;
}

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir, ": cannot open directory (", std::strerror(errno), ")");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(dir, ": cannot fsync directory (", std::strerror(err), ")");
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents);
  file.commit();
}

std::optional<std::string> replaced_file(const std::string& path) {
  if (is_special_file(path)) return std::nullopt;
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p.string();
    if (hops == 40) fail(path, ": cannot write (", std::strerror(ELOOP), ")");
    // A descriptor's link (/dev/stdout leads to /proc/self/fd/1, /dev/fd is /proc/self/fd): no name to replace.
    const fs::path dir = fs::weakly_canonical(p.has_parent_path() ? p.parent_path() : fs::path("."), ec);
    if (dir.string().rfind("/proc/", 0) == 0) return std::nullopt;
    check_link_owner(p, path);
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) fail(path, ": cannot write (", ec.message(), ")");
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
}

}  // namespace zshard
