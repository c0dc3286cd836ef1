// zshard-tune: runtime/tools/tune_tool.cpp.
#include "runtime/tools/tools.h"

int main(int argc, char** argv) { return zshard::tune_tool(argc, argv, "tiny", /*own_modes=*/false); }
