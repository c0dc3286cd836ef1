// zshard-mem: runtime/tools/mem_tool.cpp.
#include "runtime/tools/tools.h"

int main(int argc, char** argv) { return zshard::mem_tool(argc, argv, ""); }
