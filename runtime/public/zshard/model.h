// zshard's public model API: what a model of one's own implements and how it computes.
//
//   models/model.h           Model (units, init, forward/backward, activation bytes, vocabulary and
//                            context), ParamContext (gather/release/grads/grads_ready), Batch.
//   models/model_registry.h  models by name: register_model, ModelConfig, ModelBuilder.
//   kernels/tensor.h         Tensor, the views a model computes on.
//   kernels/ops.h            the compute ops on the context's device (cpu, cuda), forward and backward.
//
// Everything else in the installed tree is an implementation detail that may change.
#pragma once
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "models/model.h"
#include "models/model_registry.h"
