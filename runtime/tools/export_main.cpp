#include "runtime/tools/tools.h"

int main(int argc, char** argv) { return zshard::export_tool(argc, argv); }
