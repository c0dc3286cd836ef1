// zshard's public checking context for a model's tests: LocalParams holds every unit's parameters and
// gradients in one process, enforces the ParamContext protocol and records each call, so that a test can
// check a model's gradients (against finite differences, in f64) and how it uses gather/release/grads.
#pragma once
#include "models/local_params.h"
#include "zshard/model.h"
