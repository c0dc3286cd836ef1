// The tools as functions of the library, so that a binary with a model of its own offers them too
// (<zshard/train.h>). Each parses argv as its zshard-* program does; `default_model` is what
// --model means when not given ("" for zshard-mem: --model or --params is then required).
#pragma once
#include <string>

namespace zshard {

int train_tool(int argc, char** argv, const std::string& default_model);  // zshard-train
int bench_tool(int argc, char** argv, const std::string& default_model);  // zshard-bench
int mem_tool(int argc, char** argv, const std::string& default_model);    // zshard-mem
int export_tool(int argc, char** argv);  // zshard-export: the model is the checkpoint's
// zshard-tune. It times its candidates with zshard-bench beside it, or with `own_modes` with its own
// binary's bench mode (a train_main binary, whose model zshard-bench does not have).
int tune_tool(int argc, char** argv, const std::string& default_model, bool own_modes);

}  // namespace zshard
