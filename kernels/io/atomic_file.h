// Files written completely or not at all. Every file zshard writes (weights, checkpoint files and
// manifests, logs, reports, tools' JSON) goes through AtomicFile: the bytes go to a temporary file beside
// the target, every write is checked, then fsync, close, rename over the target and fsync of the
// directory. A reader sees the old file or the whole new one (no file at all while a dead one given up
// with Existing::overwrite is written over); a failure (full disk, read-only directory) throws one line
// naming the path and the system's reason, and leaves no temporary file behind.
// Where the path leads elsewhere, the file it names is written, never the name replaced: a symbolic link
// is followed and the file it points to replaced as above (the link stays; in a sticky shared directory
// such as /tmp, only a link of this user's or the directory owner's, as the kernel's
// fs.protected_symlinks). Written in place instead, appended to as a shell's `>>` would, and so not
// atomically: an existing file that is not a regular one (/dev/null, a FIFO, which must have a reader),
// and a file reached through an open descriptor's link (/dev/stdout redirected to a file, /dev/fd/N):
// replacing the one would destroy it, the other would cut off the shell's redirection.
#pragma once
#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace zshard {

// What becomes of a file already at the target. replace: it stays until commit renames the new one over
// it. overwrite: the caller declares its contents dead (a pruned checkpoint's rank file, recycled); it is
// moved aside at once and written over, so the file system reuses its pages or blocks instead of
// allocating new ones and freeing the old (on tmpfs the two cost about twice the copy). A process that
// still has it open then reads the new bytes. A file with other hard links, or a symbolic link, is never
// written over: another name still holds the file, so a new file replaces the name (a link itself, not
// what it points to).
enum class Existing { replace, overwrite };

class AtomicFile {
 public:
  // Creates (or, with Existing::overwrite, takes over) the temporary file; throws zshard::Error naming
  // `path` when it cannot.
  explicit AtomicFile(std::string path, Existing existing = Existing::replace);
  // Without commit() (an error on the way), the temporary file is removed and the target left as it was
  // (gone, when it was given up with Existing::overwrite).
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Makes the file durable and puts it in place. Throws on failure (the target is then as the destructor
  // leaves it).
  void commit();
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail_with_errno(const char* action, int err);

  std::string path_;    // as given, for messages
  std::string target_;  // the file replaced: path_ with its symbolic links followed
  std::string tmp_;     // beside target_; empty when writing in place (appending)
  int fd_ = -1;
  bool taken_over_ = false;  // a file written over: cut at commit to what was written
};

void write_file_atomically(const std::string& path, std::string_view contents);

// open(2) for writing (O_WRONLY | O_CLOEXEC | `flags`, mode 0644) that never waits for a FIFO's reader:
// with none, it fails at once (ENXIO) where blocking would hang the rank before any collective, out of
// reach of every deadline. -1 and errno on failure; open_error(path, errno) words it for a message.
int open_for_writing(const std::string& path, int flags);
std::string open_error(const std::string& path, int err);

// write(2) for a file that may be a pipe or a FIFO: once its reader is gone the write fails with EPIPE,
// to be reported like any other error, where SIGPIPE would end the process without a word.
ssize_t write_without_sigpipe(int fd, const void* data, size_t bytes);

// The directory `path` lies in ("." for a bare name).
std::string parent_dir(const std::string& path);

// fsyncs a directory, so that the renames and removals inside it are durable.
void sync_dir(const std::string& dir);

// The file a write to `path` replaces: its symbolic links followed to the name of the file they lead to,
// which need not exist (a dangling link names the file to create). None for a file written in place: a
// device or a FIFO, or a file reached through an open descriptor's link (/dev/stdout, /dev/fd/N,
// /proc/PID/fd/N), which a shell's redirection opened and positioned. Throws Error naming `path` for a
// link loop, or another user's link in a shared sticky directory.
std::optional<std::string> replaced_file(const std::string& path);

}  // namespace zshard
