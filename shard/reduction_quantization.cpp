#include "shard/reduction_quantization.h"

#include <zshard/error.h>

#include "shard/chunk_blocks.h"

namespace zshard {

ops::QuantFormat reduction_quant_format(ReductionQuantization q) {
  ZS_CHECK(q != ReductionQuantization::none, "no quantization format for unquantized reductions");
  return q == ReductionQuantization::int8 ? ops::QuantFormat{256, 8} : ops::QuantFormat{64, 4};
}

double quantized_reduction_bytes_per_element(ReductionQuantization q) {
  const ops::QuantFormat f = reduction_quant_format(q);
  return f.bits / 8.0 + double(sizeof(float)) / f.block;
}

int64_t quantized_chunk_bytes(const FlatLayout& layout, ReductionQuantization q) {
  return int64_t(chunk_record_size(layout, reduction_quant_format(q)).bytes());
}

}  // namespace zshard
