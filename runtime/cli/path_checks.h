// Checks of the paths a tool's flags name, made at set-up before any work: an output that can be written
// as AtomicFile writes it (kernels/io/atomic_file.h), an input that is a regular file (a FIFO would hang
// the rank before any collective), and an output that is none of the inputs.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zshard {

// Checks, before any work, that `path` can be written by `flag` as AtomicFile writes it: not a directory;
// a file that is not a regular one (a device, a FIFO) writable itself; otherwise the directory of the file
// it names (its symbolic links followed) existing and writable. Throws UsageError naming the flag. The
// write itself can still fail (a disk that fills).
void check_output_path(std::string_view flag, const std::string& path);

// Checks, before any work, that `path` given to `flag` names a regular file (or a link to one), which a
// tool reads whole: throws UsageError "FLAG PATH: no such file" or "FLAG PATH: is a FIFO (named pipe), not
// KIND" (kernels/io/file_kind.h says why only a regular file is read). A path whose status cannot be
// read is left to the open.
void check_input_file(std::string_view flag, const std::string& path, std::string_view kind);

// `path` as the comparisons below see it: absolute, its existing part's links resolved, normal, without a
// trailing separator ("out/" and "./out" are "out"). It need not exist.
std::filesystem::path normal_path(const std::filesystem::path& path);

// Whether `path` lies straight inside `dir`, a directory not made yet (a --save-dir the run makes at
// set-up): an output there needs no directory before then, so check_output_path is not for it.
bool inside_dir_not_made_yet(const std::string& path, const std::string& dir);

// A flag and the path it names, for the check below.
using FlagPath = std::pair<std::string_view, std::string>;
// Throws UsageError when `output` is one of `inputs`, or lies inside an input that is a directory: a tool
// never writes over what it reads. Empty paths, and outputs that are devices or FIFOs (written in place,
// never replaced), are skipped.
// `act` is what the tool would do to the file ("overwrite"; a stop file is removed).
void check_not_input(const FlagPath& output, const std::vector<FlagPath>& inputs, std::string_view act = "overwrite");

}  // namespace zshard
