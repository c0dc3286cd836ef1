#include "shard/chunk_blocks.h"

#include <algorithm>

#include "kernels/device_memory.h"

namespace zshard {

namespace {

std::vector<ops::HostBlockTable> every_chunk(const FlatLayout& layout, ops::QuantFormat f) {
  std::vector<ops::HostBlockTable> chunks;
  for (int shard = 0; shard < layout.group_size(); ++shard) chunks.push_back(chunk_blocks(layout, shard, f));
  return chunks;
}

size_t largest_block_count(const std::vector<ops::HostBlockTable>& chunks) {
  size_t blocks = 0;
  for (const ops::HostBlockTable& c : chunks) blocks = std::max(blocks, c.blocks());
  return blocks;
}

size_t entries_bytes(const std::vector<ops::HostBlockTable>& chunks) {
  size_t bytes = 0;
  for (const ops::HostBlockTable& c : chunks) bytes += c.entries().size() * sizeof(int64_t);
  return bytes;
}

}  // namespace

ops::HostBlockTable chunk_blocks(const FlatLayout& layout, int shard, ops::QuantFormat f) {
  const int64_t begin = layout.shard_begin(shard), end = begin + layout.shard_numel();
  std::vector<int64_t> piece_begin = {0};
  for (const FlatSegment& s : layout.segments(begin, end)) {
    // Parameters are contiguous in the flat buffer: a new piece wherever one begins inside the chunk.
    if (s.flat_begin > begin) piece_begin.push_back(s.flat_begin - begin);
    // A parameter begun in an earlier chunk keeps its own grid of blocks (f.block elements from its first),
    // the chunk's start taking a short block to the next line of that grid: a block then holds the same
    // elements at any world size and, where a row's length is a multiple of f.block (GPT-2's and Llama's
    // widths), one row only. Blocks cut from the chunk's start would straddle rows: an embedding's rare
    // token rounded on a frequent neighbour's scale.
    const int64_t into_block = s.param_offset % f.block;
    if (into_block != 0 && f.block - into_block < s.count)
      piece_begin.push_back(s.flat_begin - begin + f.block - into_block);
  }
  if (layout.numel() > begin && layout.numel() < end) piece_begin.push_back(layout.numel() - begin);
  piece_begin.push_back(end - begin);
  return ops::HostBlockTable(piece_begin, f);
}

ops::QuantizedSize chunk_record_size(const FlatLayout& layout, ops::QuantFormat f) {
  return ops::quantized_size(size_t(layout.shard_numel()), f.bits, largest_block_count(every_chunk(layout, f)));
}

double record_bytes_per_element(const std::vector<FlatLayout>& layouts, ops::QuantFormat f) {
  double bytes = 0, elements = 0;
  for (const FlatLayout& l : layouts) {
    if (l.numel() == 0) continue;  // a buffer without parameters is not sent
    bytes += double(l.group_size()) * double(chunk_record_size(l, f).bytes());
    elements += double(l.numel());
  }
  return elements > 0 ? bytes / elements : 0;
}

ChunkBlockTables::ChunkBlockTables(const FlatLayout& layout, ops::QuantFormat f, Device device, Category category)
    : format_(f), chunks_(every_chunk(layout, f)) {
  record_ = ops::quantized_size(size_t(layout.shard_numel()), f.bits, largest_block_count(chunks_));
  std::vector<int64_t> entries;
  for (const ops::HostBlockTable& c : chunks_) {
    offsets_.push_back(entries.size());
    entries.insert(entries.end(), c.entries().begin(), c.entries().end());
  }
  entries_ = std::make_unique<Buffer>(entries.size() * sizeof(int64_t), device, category);
  copy_bytes(entries_->data(), device, entries.data(), Device::cpu, entries_->bytes());
}

ops::BlockTable ChunkBlockTables::chunk(int shard) const {
  return chunks_[size_t(shard)].table_at(static_cast<const int64_t*>(entries_->data()) + offsets_[size_t(shard)]);
}

int64_t ChunkBlockTables::bytes(const FlatLayout& layout, ops::QuantFormat f) {
  return int64_t(entries_bytes(every_chunk(layout, f)));
}

}  // namespace zshard
