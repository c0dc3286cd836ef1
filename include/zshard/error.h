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

// A bad command-line value: the message names the flag; programs exit with code 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

// Refuses a bad value the user gave: the message names the flag (UsageError, exit code 2).
template <class... Args>
[[noreturn]] void refuse(const Args&... args) {
  throw UsageError(detail::concat(args...));
}

}  // namespace zshard

// ZS_CHECK(cond, msg...) throws zshard::Error with file:line when cond is false.
#define ZS_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::zshard::fail(__FILE__, ":", __LINE__, ": ", __VA_ARGS__);                            \
  } while (0)
