#include "kernels/io/file_kind.h"

namespace zshard {

std::string_view unreadable_kind(std::filesystem::file_type type) {
  using std::filesystem::file_type;
  switch (type) {
    case file_type::regular:
    case file_type::none:
    case file_type::not_found: return {};
    case file_type::directory: return "a directory";
    case file_type::fifo: return "a FIFO (named pipe)";
    case file_type::character: return "a character device";
    case file_type::block: return "a block device";
    case file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

}  // namespace zshard
