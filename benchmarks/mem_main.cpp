// zshard-mem: runtime/mem_tool.cpp.
#include "runtime/tools.h"

int main(int argc, char** argv) { return zshard::mem_tool(argc, argv, ""); }
