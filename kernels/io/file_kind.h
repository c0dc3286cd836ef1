// Files zshard reads whole (weights, dumps, data) must be regular files, or links to one: opening a FIFO
// waits for a writer, before any collective, where no deadline reaches it; a device such as /dev/zero
// never ends; a directory holds no bytes to read. Checked from the file's status, before it is opened.
#pragma once
#include <filesystem>
#include <string_view>

namespace zshard {

// What a file of this type is when it cannot be read whole: "a directory", "a FIFO (named pipe)", "a
// character device", "a block device", "a socket"; empty for a regular file, and for a path that does
// not exist or whose status could not be read (the open then says why).
std::string_view unreadable_kind(std::filesystem::file_type type);

}  // namespace zshard
