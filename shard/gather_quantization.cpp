#include "shard/gather_quantization.h"

#include "shard/chunk_blocks.h"

namespace zshard {

int64_t quantized_shard_bytes(const FlatLayout& layout) {
  return int64_t(chunk_record_size(layout, kGatherQuantFormat).bytes());
}

int64_t gathered_buffer_bytes(const FlatLayout& layout, int param_bytes, bool quantized) {
  const int64_t records = quantized && layout.numel() > 0 ? layout.group_size() * quantized_shard_bytes(layout) : 0;
  return layout.padded_numel() * param_bytes + records;
}

int64_t unit_gathered_bytes(const FlatLayout& trainable, const FlatLayout& frozen, int param_bytes, bool quantized) {
  return gathered_buffer_bytes(trainable, param_bytes, quantized) +
         (frozen.numel() > 0 ? gathered_buffer_bytes(frozen, param_bytes, quantized) : 0);
}

}  // namespace zshard
