// zshard-train: runtime/tools/train_tool.cpp.
#include "runtime/tools/tools.h"

int main(int argc, char** argv) { return zshard::train_tool(argc, argv, "tiny"); }
