#include "runtime/cli/optimizer_options.h"

#include <algorithm>
#include <cmath>

#include <CLI/CLI.hpp>

#include <zshard/error.h>

namespace zshard {

namespace {

// Written so that NaN fails too (every comparison with NaN is false), and +-inf fails the bounds.
void check_range(const char* flag, double value, double lo, double hi, const char* note = "") {
  if (!(std::isfinite(value) && value >= lo && value <= hi))
    refuse(flag, " must be a finite number in [", lo, ", ", hi, "]", note, ", got ", value);
}
void check_at_least(const char* flag, double value, double lo, const char* note = "") {
  if (!(std::isfinite(value) && value >= lo)) refuse(flag, " must be a finite number >= ", lo, note, ", got ", value);
}

}  // namespace

LrSchedule OptimizerOptions::schedule() const {
  return {lr, min_lr, warmup, std::max(steps, 1), lr_schedule == "cosine"};
}

AdamW OptimizerOptions::adamw(int step) const { return {schedule().at(step), beta1, beta2, eps, wd, grad_clip}; }

void add_optimizer_flags(CLI::App& app, OptimizerOptions& o) {
  app.add_option("--steps", o.steps, "optimizer steps");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--warmup", o.warmup, "linear warmup steps");
  app.add_option("--lr-schedule", o.lr_schedule, "constant or cosine (decays toward --min-lr)");
  app.add_option("--min-lr", o.min_lr,
                 "where the cosine schedule ends: it would reach it at step --steps + 1, so the last step runs a "
                 "little above it (llm.c's and nanoGPT's convention)");
  app.add_option("--wd", o.wd, "AdamW weight decay (matrices and embeddings only)");
  app.add_option("--beta1", o.beta1, "AdamW beta1");
  app.add_option("--beta2", o.beta2, "AdamW beta2");
  app.add_option("--eps", o.eps, "AdamW epsilon");
  app.add_option("--grad-clip", o.grad_clip, "global gradient-norm clip (0 disables)");
}

void validate(const OptimizerOptions& o) {
  if (o.steps < 0) refuse("--steps must be >= 0, got ", o.steps);
  check_range("--lr", o.lr, 0, 1);
  check_range("--min-lr", o.min_lr, 0, o.lr, " (at most --lr)");
  if (o.warmup < 0) refuse("--warmup must be >= 0, got ", o.warmup);
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine")
    refuse("--lr-schedule must be constant or cosine, got '", o.lr_schedule, "'");
  if (o.lr_schedule == "constant" && o.min_lr != 0)
    refuse("--min-lr is only for --lr-schedule cosine (a constant rate never decays to it)");
  check_at_least("--wd", o.wd, 0);
  // Decoupled decay multiplies each weight by 1 - lr * wd: past 1 it flips the weights' sign.
  if (double(o.lr) * o.wd > 1) refuse("--wd ", o.wd, " times --lr ", o.lr, " exceeds 1: the decay would flip weights");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) refuse("--beta1 must be in [0, 1), got ", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) refuse("--beta2 must be in [0, 1), got ", o.beta2);
  if (!(o.eps > 0 && o.eps <= 1)) refuse("--eps must be in (0, 1], got ", o.eps);
  check_at_least("--grad-clip", o.grad_clip, 0, " (0 disables)");
}

}  // namespace zshard
