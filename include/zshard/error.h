// Errors: every failure in zshard is a zshard::Error carrying a one-line message with its context.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace zshard {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A bad value the user gave: the message names the option (or, in zshard's tools, the flag) that gave it;
// programs exit with code 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

// A checkpoint that is not what its manifest records (a file missing, truncated or failing its checksum; a
// manifest that is not one): the disk's fault, not the flags'. Programs exit with code 3, which tells
// zshard-run to set that checkpoint aside and resume from the one before it.
class DamagedCheckpoint : public Error {
 public:
  explicit DamagedCheckpoint(const std::string& what) : Error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// A failure every rank of the job throws alike, agreed through a collective (a file one rank cannot read,
// a non-finite step, a save that failed): no rank is left waiting, so the job ends with exit_code() on
// every rank, and only the rank whose report() is true prints the message (the lowest failing rank; the
// others hold "another rank failed"). What any other exception leaves is one rank's failure: the others
// may be inside a collective, and the loop must end the whole job (World::abort).
class AgreedFailure : public Error {
 public:
  AgreedFailure(const std::string& what, int exit_code, bool report)
      : Error(what), exit_code_(exit_code), report_(report) {}
  // 2 for a bad value (a UsageError), 3 for a damaged checkpoint (DamagedCheckpoint), else 1
  int exit_code() const { return exit_code_; }
  bool report() const { return report_; }

 private:
  int exit_code_;
  bool report_;
};

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

// Refuses a bad value the user gave: the message names where it came from (UsageError, exit code 2).
template <class... Args>
[[noreturn]] void refuse(const Args&... args) {
  throw UsageError(detail::concat(args...));
}

template <class... Args>
[[noreturn]] void damaged(const Args&... args) {
  throw DamagedCheckpoint(detail::concat(args...));
}

}  // namespace zshard

// ZS_CHECK(cond, msg...) throws zshard::Error with file:line when cond is false.
#define ZS_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::zshard::fail(__FILE__, ":", __LINE__, ": ", __VA_ARGS__);                            \
  } while (0)
