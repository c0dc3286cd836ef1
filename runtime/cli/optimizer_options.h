// The optimizer and its schedule, and their flags: --steps, --lr, --warmup, --lr-schedule, --min-lr,
// AdamW's --wd --beta1 --beta2 --eps, and --grad-clip.
#pragma once
#include <string>

#include <zshard/engine.h>
#include <zshard/lr_schedule.h>

#include "runtime/cli/cli_fwd.h"

namespace zshard {

struct OptimizerOptions {
  int steps = 300;
  float lr = 3e-3f;
  int warmup = 0;
  std::string lr_schedule = "cosine";
  float min_lr = 0.0f;
  float wd = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;

  LrSchedule schedule() const;
  // AdamW's hyper-parameters at optimizer step `step` (0-based): the schedule's rate and the rest.
  AdamW adamw(int step) const;
};

void add_optimizer_flags(CLI::App& app, OptimizerOptions& options);
// Every float finite and in range (a NaN or inf hyper-parameter would train on garbage); throws UsageError
// naming the flag.
void validate(const OptimizerOptions& options);

}  // namespace zshard
