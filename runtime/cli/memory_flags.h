// Values of the memory flags (--mem-budget, zshard-mem's --dtype).
#pragma once
#include <cstdint>
#include <string>

#include <zshard/dtype.h>

namespace zshard {

// Parses "80GiB", "80GB", "1.5e9", "512MiB" into bytes; throws UsageError naming `flag` otherwise.
int64_t parse_bytes(const std::string& text, const std::string& flag);
// zshard-mem's --dtype: "fp32", or "mixed" (bf16 params and grads, fp32 master + Adam: the ZeRO paper's
// K=12), as the parameter dtype of a plan.
DType parse_dtype_policy(const std::string& name);

}  // namespace zshard
