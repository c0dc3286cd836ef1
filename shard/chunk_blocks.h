// The blocks quantized collectives (--quantize-gathers, --quantize-reductions) cut a flat buffer's chunks
// into, one chunk being one shard of the buffer. A chunk is cut into pieces at every parameter boundary
// inside it and where its padding starts, and each piece into blocks of at most f.block elements from the
// piece's own start (ops::HostBlockTable); a parameter begun in an earlier chunk first takes a short piece
// up to the next multiple of f.block counted from its own first element. A block then never holds two
// parameters, so a parameter of small values (a LayerNorm weight's gradient, 0.02-scale weights beside a
// LayerNorm's 1.0) is rounded on its own scale, never on a large neighbour's, and every element is within
// half its own parameter's block scale; and a parameter's blocks lie on its own grid at any world size,
// one row each where a row's length is a multiple of f.block. The price: each piece's last block is
// short, up to one more scale per parameter a chunk holds and one for the short block at its start. The
// chunks of a buffer are exchanged by collectives that take one count, so every chunk travels in the
// record of the buffer's largest block count (its last scales unused in the others).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <zshard/memory.h>

#include "kernels/engine_ops.h"
#include "shard/flat_unit.h"

namespace zshard {

// Chunk `shard` of `layout`, cut for f: the one definition of the blocks, which the engine quantizes in
// and the size arithmetic counts.
ops::HostBlockTable chunk_blocks(const FlatLayout& layout, int shard, ops::QuantFormat f);

// The record every chunk of `layout` travels in: the payload of a shard, then the scales of the chunk
// with the most blocks.
ops::QuantizedSize chunk_record_size(const FlatLayout& layout, ops::QuantFormat f);

// Bytes per parameter element that a collective of these buffers' records moves, every chunk's record
// of every buffer with parameters over their parameters: a model's own figure, above the nominal
// bits / 8 + 4 / f.block by its short blocks and its padding.
double record_bytes_per_element(const std::vector<FlatLayout>& layouts, ops::QuantFormat f);

// Every chunk's table of one flat buffer, built once at set-up and kept where the kernels read them (the
// run's device, counted under the category of what they quantize), with the record size they imply.
class ChunkBlockTables {
 public:
  ChunkBlockTables() = default;  // none: a buffer that is not quantized
  ChunkBlockTables(const FlatLayout& layout, ops::QuantFormat f, Device device, Category category);
  ops::QuantFormat format() const { return format_; }
  const ops::QuantizedSize& record() const { return record_; }
  ops::BlockTable chunk(int shard) const;
  // What one of `layout` in format f holds.
  static int64_t bytes(const FlatLayout& layout, ops::QuantFormat f);

 private:
  ops::QuantFormat format_{};
  ops::QuantizedSize record_{};
  std::vector<ops::HostBlockTable> chunks_;
  std::vector<size_t> offsets_;  // where each chunk's entries start in entries_
  std::unique_ptr<Buffer> entries_;
};

}  // namespace zshard
