// zshard's public entry point: one call makes a binary a zshard trainer for its model (every
// zshard-train flag), with `bench` and `mem` modes (zshard-bench, zshard-mem). See runtime/train_entry.h.
#pragma once
#include "runtime/train_entry.h"
#include "zshard/model.h"
