// zshard-bench: runtime/tools/bench_tool.cpp.
#include "runtime/tools/tools.h"

int main(int argc, char** argv) { return zshard::bench_tool(argc, argv, "tiny"); }
