#include "shard/reduction_quantization.h"

#include <zshard/error.h>

namespace zshard {

ops::QuantFormat reduction_quant_format(ReductionQuantization q) {
  ZS_CHECK(q != ReductionQuantization::none, "no quantization format for unquantized reductions");
  return {256, q == ReductionQuantization::int8 ? 8 : 4};
}

double quantized_reduction_bytes_per_element(ReductionQuantization q) {
  const ops::QuantFormat f = reduction_quant_format(q);
  return f.bits / 8.0 + double(sizeof(float)) / f.block;
}

int64_t quantized_chunk_bytes(int64_t shard_numel, ReductionQuantization q) {
  return int64_t(ops::quantized_size(size_t(shard_numel), reduction_quant_format(q)).bytes());
}

}  // namespace zshard
