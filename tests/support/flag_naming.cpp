// Compiled into every test binary: zshard's tests drive the core as its tools do, and check the messages
// the tools print, so errors name the flags (kernels/option_names.h). test_option_names checks the
// library's own naming.
#include "kernels/option_names.h"

namespace {
const bool flags_named = [] {
  zshard::set_option_naming(zshard::OptionNaming::flags);
  return true;
}();
}  // namespace
