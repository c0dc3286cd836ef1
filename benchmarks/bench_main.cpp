// zshard-bench: runtime/bench_tool.cpp.
#include "runtime/tools.h"

int main(int argc, char** argv) { return zshard::bench_tool(argc, argv, "tiny"); }
