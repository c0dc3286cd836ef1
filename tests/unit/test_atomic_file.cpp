// AtomicFile and the output checks every tool runs: a file is written whole or not at all (over a dead
// file's own pages when asked, never through another name of it), a failure names the path and the
// system's reason, and no tool writes over or into its own inputs. Full disks and
// read-only directories are exercised end to end by tests/cli/test_faults_outputs.sh.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <zshard/error.h>

#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using test::TempDir;

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

int entries(const TempDir& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++n;
  return n;
}

TEST(AtomicFile, ReplacesTheTargetOnlyAtCommit) {
  TempDir dir;
  const std::string path = dir.file("out.json");
  write_file_atomically(path, "old\n");
  {
    AtomicFile file(path);
    file.write("new ");
    EXPECT_EQ(contents(path), "old\n") << "the target is untouched until commit";
    file.write(std::string(100000, 'x'));
    file.commit();
  }
  EXPECT_EQ(contents(path), "new " + std::string(100000, 'x'));
  EXPECT_EQ(entries(dir), 1) << "no temporary file left";
}

TEST(AtomicFile, AbandonedWriteLeavesTargetAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("out.json");
  write_file_atomically(path, "old\n");
  {
    AtomicFile file(path);
    file.write("half");
  }  // an error unwound before commit
  EXPECT_EQ(contents(path), "old\n");
  EXPECT_EQ(entries(dir), 1);
}

ino_t inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

ino_t inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

void overwrite(const std::string& path, std::string_view text) {
  AtomicFile file(path, Existing::overwrite);
  file.write(text);
  file.commit();
}

TEST(AtomicFile, OverwriteWritesOverTheDeadFileAndCutsItToTheNewLength) {
  TempDir dir;
  const std::string path = dir.file("rank.bin");
  write_file_atomically(path, std::string(200000, 'o'));
  // Held open, the old file keeps its inode number from being handed to a new file.
  const int old = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(old, 0);
  {
    AtomicFile file(path, Existing::overwrite);
    file.write("new ");
    file.write(std::string(1000, 'x'));
    file.commit();
  }
  EXPECT_EQ(contents(path), "new " + std::string(1000, 'x'));
  EXPECT_EQ(inode(path), inode(old)) << "written over, not a new file";
  EXPECT_EQ(entries(dir), 1);
  ::close(old);
}

TEST(AtomicFile, OverwriteLeavesAFileOtherNamesHold) {
  TempDir dir;
  const std::string path = dir.file("rank.bin"), backup = dir.file("backup.bin");
  write_file_atomically(path, "precious");
  ASSERT_EQ(::link(path.c_str(), backup.c_str()), 0);
  overwrite(path, "new");
  EXPECT_EQ(contents(path), "new");
  EXPECT_EQ(contents(backup), "precious") << "a hard link is never written through";
  EXPECT_NE(inode(path), inode(backup));

  const std::string link = dir.file("link.bin"), target = dir.file("target.bin");
  write_file_atomically(target, "elsewhere");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  overwrite(link, "new");
  EXPECT_EQ(contents(link), "new");
  EXPECT_EQ(contents(target), "elsewhere") << "a symbolic link is never written through";
}

TEST(AtomicFile, OverwriteWithoutAFileCreatesOne) {
  TempDir dir;
  overwrite(dir.file("a"), "fresh");
  EXPECT_EQ(contents(dir.file("a")), "fresh");
  EXPECT_EQ(entries(dir), 1);
}

TEST(AtomicFile, AbandonedOverwriteLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("rank.bin");
  write_file_atomically(path, "dead");
  {
    AtomicFile file(path, Existing::overwrite);
    file.write("half");
  }  // an error unwound before commit: the file given up is gone with the temporary
  EXPECT_EQ(entries(dir), 0);
}

TEST(AtomicFile, FollowsALinkAndReplacesTheFileItNames) {
  TempDir links, files;
  namespace fs = std::filesystem;
  const std::string target = files.file("report.json"), link = links.file("latest.json");
  write_file_atomically(target, "old\n");
  fs::create_symlink(target, link);
  fs::create_symlink("report.json", files.file("relative.json"));
  write_file_atomically(link, "new\n");
  EXPECT_TRUE(fs::is_symlink(link)) << "the link stays a link";
  EXPECT_EQ(contents(target), "new\n");
  write_file_atomically(files.file("relative.json"), "newer\n");
  EXPECT_EQ(contents(target), "newer\n") << "a relative link is taken from its own directory";
  fs::create_symlink(files.file("made.json"), links.file("dangling.json"));
  write_file_atomically(links.file("dangling.json"), "made\n");
  EXPECT_EQ(contents(files.file("made.json")), "made\n") << "a dangling link names the file to create";
  EXPECT_EQ(entries(links), 2) << "links only, no temporary file";
  EXPECT_EQ(entries(files), 3);
}

// A device (/dev/null, /dev/stdout) or a FIFO is written in place: replacing it with a regular file would
// destroy it. A FIFO stands for both here; the test never touches the machine's own devices.
TEST(AtomicFile, WritesAFifoInPlaceThroughALinkToo) {
  TempDir dir;
  namespace fs = std::filesystem;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(fifo, dir.file("to-pipe"));
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // so that opening for writing does not wait
  ASSERT_GE(reader, 0);
  write_file_atomically(fifo, "one ");
  write_file_atomically(dir.file("to-pipe"), "two");
  char got[16] = {};
  EXPECT_EQ(::read(reader, got, sizeof got), 7);
  EXPECT_EQ(std::string(got), "one two");
  ::close(reader);
  EXPECT_TRUE(fs::is_fifo(fifo)) << "still a FIFO";
  EXPECT_TRUE(fs::is_symlink(dir.file("to-pipe")));
  EXPECT_EQ(entries(dir), 2) << "no temporary file";
  EXPECT_EQ(error_of([&] { check_output_path("--json", dir.file("to-pipe")); }), "(no error)");
  EXPECT_EQ(error_of([&] { check_not_input({"--json", fifo}, {{"--log-json", dir.file("to-pipe")}}); }), "(no error)")
      << "outputs may share a device or a FIFO: nothing is replaced";
}

// A reader that goes away mid-run (a `tail` stopped, a pipeline's end exited) makes the next write fail
// with a line naming the file; SIGPIPE would have ended the rank without one. The signal is not lost to
// a process that has one of its own pending.
TEST(AtomicFile, AFifoWhoseReaderLeftFailsWithAMessage) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  AtomicFile file(fifo);
  file.write("read\n");
  ::close(reader);
  EXPECT_EQ(error_of([&] { file.write("lost\n"); }), fifo + ": cannot write (" + std::strerror(EPIPE) + ")");

  sigset_t pipe_signal, old_mask, pending;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &pipe_signal, &old_mask), 0);
  ASSERT_EQ(::raise(SIGPIPE), 0);  // the process's own, pending before the write
  const int again = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(again, 0);
  AtomicFile second(fifo);
  ::close(again);
  EXPECT_THAT(error_of([&] { second.write("lost\n"); }), HasSubstr(std::strerror(EPIPE)));
  sigpending(&pending);
  EXPECT_TRUE(sigismember(&pending, SIGPIPE)) << "the signal raised before the write is still pending";
  const timespec no_wait{};
  EXPECT_EQ(sigtimedwait(&pipe_signal, nullptr, &no_wait), SIGPIPE);
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old_mask, nullptr), 0);
}

// A file reached through an open descriptor's link (/dev/stdout redirected to a file, /proc/self/fd/N)
// is written through, never replaced: replacing it would cut off the shell's redirection and drop what
// the file held.
TEST(AtomicFile, WritesThroughADescriptorsLink) {
  TempDir dir;
  const std::string out = dir.file("redirected.log");
  write_file_atomically(out, "before\n");
  struct stat was {};
  ASSERT_EQ(::stat(out.c_str(), &was), 0);
  std::fflush(nullptr);
  const int saved = ::dup(STDOUT_FILENO), fd = ::open(out.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  ::dup2(fd, STDOUT_FILENO);  // as `>> redirected.log` does
  write_file_atomically("/dev/stdout", "through stdout\n");
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  write_file_atomically("/proc/self/fd/" + std::to_string(fd), "through the fd's link\n");
  ::close(fd);
  struct stat now {};
  ASSERT_EQ(::stat(out.c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, was.st_ino) << "the same file, not a new one";
  EXPECT_EQ(contents(out), "before\nthrough stdout\nthrough the fd's link\n");
}

TEST(AtomicFile, LinkLoopsFifosWithoutReadersAndOthersLinksInSharedDirectoriesFail) {
  TempDir dir;
  namespace fs = std::filesystem;
  fs::create_symlink("b", dir.file("a"));
  fs::create_symlink("a", dir.file("b"));
  EXPECT_EQ(error_of([&] { write_file_atomically(dir.file("a"), "x"); }),
            dir.file("a") + ": cannot write (Too many levels of symbolic links)");
  ASSERT_EQ(::mkfifo(dir.file("pipe").c_str(), 0600), 0);
  EXPECT_EQ(error_of([&] { write_file_atomically(dir.file("pipe"), "x"); }),
            dir.file("pipe") + ": cannot write (a FIFO that no process reads)")
      << "fails at once, where blocking would hang the rank before any deadline";
  // /tmp's case: a sticky, world-writable directory and a link another user planted there.
  const std::string shared = dir.file("shared");
  fs::create_directory(shared);
  ::chmod(shared.c_str(), 01777);
  fs::create_symlink(dir.file("victim"), shared + "/run.json");
  if (::geteuid() == 0 && ::lchown((shared + "/run.json").c_str(), 4242, 4242) == 0) {
    EXPECT_THAT(error_of([&] { write_file_atomically(shared + "/run.json", "x"); }),
                HasSubstr("is another user's link in the shared directory"));
    EXPECT_FALSE(fs::exists(dir.file("victim")));
  }
}

TEST(AtomicFile, FailuresNamePathAndReason) {
  TempDir dir;
  EXPECT_EQ(error_of([&] { write_file_atomically(dir.file("no/such/dir/x"), "x"); }),
            dir.file("no/such/dir/x") + ": cannot write (No such file or directory)");
  EXPECT_EQ(error_of([&] { write_file_atomically(dir.path().string(), "x"); }),
            dir.path().string() + ": cannot write (it is a directory)");
}

TEST(OutputChecks, RefuseDirectoriesAndMissingParents) {
  TempDir dir;
  EXPECT_EQ(error_of([&] { check_output_path("--json", dir.path().string()); }),
            "--json " + dir.path().string() + ": is a directory");
  EXPECT_THAT(error_of([&] { check_output_path("--json", dir.file("nope/out.json")); }),
              HasSubstr("--json " + dir.file("nope/out.json") + ": directory " + dir.file("nope") +
                        " does not exist"));
  EXPECT_EQ(error_of([&] { check_output_path("--json", dir.file("out.json")); }), "(no error)");
  EXPECT_EQ(error_of([&] { check_output_path("--json", "relative.json"); }), "(no error)");
  std::filesystem::create_symlink(dir.file("gone/out.json"), dir.file("link.json"));
  EXPECT_THAT(error_of([&] { check_output_path("--json", dir.file("link.json")); }),
              HasSubstr("--json " + dir.file("link.json") + ": directory " + dir.file("gone") + " does not exist"))
      << "the directory checked is the one the link leads to";
}

TEST(OutputChecks, RefuseWritingOverOrIntoAnInput) {
  TempDir dir;
  const std::string ckpt = dir.file("step-00000004");
  std::filesystem::create_directories(ckpt);
  write_file_atomically(ckpt + "/rank-00000.safetensors", "x");
  const std::vector<FlagPath> inputs = {{"--data", dir.file("tokens.bin")}, {"CHECKPOINT", ckpt}, {"--empty", ""}};
  EXPECT_THAT(error_of([&] { check_not_input({"--out", ckpt + "/rank-00000.safetensors"}, inputs); }),
              HasSubstr("lies inside " + ckpt + " (CHECKPOINT): refusing to write into an input"));
  EXPECT_THAT(error_of([&] { check_not_input({"--out", ckpt + "/new.safetensors"}, inputs); }),
              HasSubstr("refusing to write into an input"));
  EXPECT_THAT(error_of([&] { check_not_input({"--out", ckpt + "/../step-00000004/x"}, inputs); }),
              HasSubstr("refusing to write into an input"));
  EXPECT_THAT(error_of([&] { check_not_input({"--out", ckpt}, inputs); }),
              HasSubstr("names the same file as CHECKPOINT"));
  EXPECT_THAT(error_of([&] { check_not_input({"--out", dir.file("./tokens.bin")}, inputs); }),
              HasSubstr("--out " + dir.file("./tokens.bin") + " names the same file as --data"));
  EXPECT_EQ(error_of([&] { check_not_input({"--out", dir.file("step-00000004.safetensors")}, inputs); }),
            "(no error)");
  EXPECT_EQ(error_of([&] { check_not_input({"--out", ""}, inputs); }), "(no error)");
  // A path that does not exist yet is the same with a trailing separator: "new/" is "new".
  EXPECT_THAT(error_of([&] { check_not_input({"--out", dir.file("new/")}, {{"--in", dir.file("./new")}}); }),
              HasSubstr("names the same file as --in"));
}

TEST(OutputChecks, NormalPathsAreAbsoluteWithoutDotsLinksOrTrailingSeparators) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("real"));
  std::filesystem::create_directory_symlink(dir.file("real"), dir.file("link"));
  const std::filesystem::path real = normal_path(dir.file("real"));
  EXPECT_TRUE(real.is_absolute());
  EXPECT_EQ(normal_path(dir.file("link/")), real);
  EXPECT_EQ(normal_path(dir.file("./real/../real/")), real);
  EXPECT_EQ(normal_path(dir.file("link/not-yet/")), real / "not-yet");
}

}  // namespace
}  // namespace zshard
