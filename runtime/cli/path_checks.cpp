#include "runtime/cli/path_checks.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include <zshard/error.h>

#include "kernels/io/atomic_file.h"
#include "kernels/io/file_kind.h"

namespace zshard {

namespace fs = std::filesystem;

fs::path normal_path(const fs::path& path) {
  std::error_code ec;
  const fs::path normal = fs::weakly_canonical(fs::absolute(path, ec), ec).lexically_normal();
  return normal.has_filename() ? normal : normal.parent_path();
}

bool inside_dir_not_made_yet(const std::string& path, const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || fs::is_directory(dir, ec)) return false;
  return normal_path(fs::path(path).parent_path()) == normal_path(dir);
}

void check_output_path(std::string_view flag, const std::string& path) {
  std::error_code ec;
  if (path.empty()) throw UsageError(detail::concat(flag, ": empty path"));
  if (fs::is_directory(path, ec)) throw UsageError(detail::concat(flag, " ", path, ": is a directory"));
  std::optional<std::string> replaced;
  try {
    replaced = replaced_file(path);
  } catch (const Error& e) {
    throw UsageError(detail::concat(flag, " ", e.what()));
  }
  if (!replaced) {
    if (::access(path.c_str(), W_OK) != 0)
      throw UsageError(detail::concat(flag, " ", path, ": cannot write (", std::strerror(errno), ")"));
    return;
  }
  const std::string dir = parent_dir(*replaced);
  if (!fs::is_directory(dir, ec))
    throw UsageError(detail::concat(flag, " ", path, ": directory ", dir, " does not exist"));
  if (::access(dir.c_str(), W_OK) != 0)
    throw UsageError(detail::concat(flag, " ", path, ": cannot write into ", dir, " (", std::strerror(errno), ")"));
}

void check_input_file(std::string_view flag, const std::string& path, std::string_view kind) {
  std::error_code ec;
  const fs::file_type type = fs::status(path, ec).type();
  if (type == fs::file_type::not_found) throw UsageError(detail::concat(flag, " ", path, ": no such file"));
  if (const std::string_view what = unreadable_kind(type); !what.empty())
    throw UsageError(detail::concat(flag, " ", path, ": is ", what, ", not ", kind));
}

void check_not_input(const FlagPath& output, const std::vector<FlagPath>& inputs, std::string_view act) {
  const auto& [out_flag, out] = output;
  // A file written in place is never replaced: /dev/null may take every output, and /dev/stdout too.
  if (out.empty()) return;
  try {
    if (!replaced_file(out)) return;
  } catch (const Error&) {  // check_output_path reports it
  }
  std::error_code ec;
  const fs::path target = normal_path(out);
  for (const auto& [in_flag, in] : inputs) {
    if (in.empty()) continue;
    const fs::path source = normal_path(in);
    if (target == source)
      throw UsageError(detail::concat(out_flag, " ", out, " names the same file as ", in_flag, ": refusing to ", act, " it"));
    if (!fs::is_directory(source, ec)) continue;
    // Inside the input directory: the relative path from it does not climb out.
    const fs::path rel = target.lexically_relative(source);
    if (!rel.empty() && *rel.begin() != "..")
      throw UsageError(
          detail::concat(out_flag, " ", out, " lies inside ", in, " (", in_flag, "): refusing to write into an input"));
  }
}

}  // namespace zshard
