// The blocks quantized collectives cut a flat buffer's chunks into (shard/chunk_blocks.h): for a unit of
// long, short and empty parameters, in groups of 1 to 7 ranks and padded further for groups of other
// sizes, each chunk's blocks cover it exactly, in order, none longer than the format's block; none holds
// elements of two parameters, or of a parameter and the padding; each parameter's blocks lie on its own
// grid of the format's block, whatever the chunk's edges; and they are as few as that allows. The
// record every chunk travels in has the scales of the chunk with the most blocks.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/quantize_blocks.h"
#include "shard/chunk_blocks.h"

namespace zshard {
namespace {

const UnitSpec kUnit = {"mixed",
                        {{"w", {300}, true},
                         {"gain", {1}, false},
                         {"none", {0}, false},
                         {"b", {2, 106}, false},
                         {"ln.weight", {64}, false},
                         {"ln.bias", {64}, false},
                         {"proj", {8, 512}, true},
                         {"tail", {7}, false}}};

// What flat element i belongs to: its parameter's index, or -1 for the padding.
int owner(const FlatLayout& layout, int64_t i) {
  for (int p = 0; p < int(layout.spec().params.size()); ++p)
    if (i >= layout.offset(p) && i < layout.offset(p) + layout.spec().params[size_t(p)].numel()) return p;
  return -1;
}

void check_chunks(const FlatLayout& layout, ops::QuantFormat f) {
  SCOPED_TRACE(testing::Message() << "group " << layout.group_size() << ", padded to " << layout.padded_numel()
                                  << ", blocks of " << f.block);
  const int64_t shard = layout.shard_numel();
  size_t most_blocks = 0;
  for (int c = 0; c < layout.group_size(); ++c) {
    SCOPED_TRACE(testing::Message() << "chunk " << c);
    const ops::HostBlockTable blocks = chunk_blocks(layout, c, f);
    const ops::BlockTable table = blocks.host_table();
    ASSERT_EQ(blocks.numel(), size_t(shard));
    const int64_t base = layout.shard_begin(c);
    size_t next = 0;  // where the next block must begin
    for (size_t b = 0; b < blocks.blocks(); ++b) {
      const quant::ElementRange r = quant::block_elements(table, b);
      ASSERT_EQ(r.begin, next) << "block " << b;
      ASSERT_GT(r.end, r.begin) << "block " << b;
      ASSERT_LE(r.end - r.begin, size_t(f.block)) << "block " << b;
      for (size_t i = r.begin; i < r.end; ++i) {
        ASSERT_EQ(owner(layout, base + int64_t(i)), owner(layout, base + int64_t(r.begin))) << "element " << i;
        ASSERT_EQ(quant::block_of(table, i), b) << "element " << i;
      }
      next = r.end;
    }
    EXPECT_EQ(next, size_t(shard));
    // Exactly where a block must begin: at the chunk's start, at a new owner, and at every f.block-th
    // element of a parameter counted from the parameter's own first element (the padding's from where it
    // begins in the chunk), so that a block is the same elements whatever the chunk's edges.
    size_t fewest = 0;
    for (int64_t i = 0, run = 0; i < shard; ++i) {
      const int o = owner(layout, base + i);
      run = i > 0 && o == owner(layout, base + i - 1) ? run + 1 : 0;
      const int64_t grid = o >= 0 ? base + i - layout.offset(o) : run;
      const bool begins = run == 0 || grid % f.block == 0;
      fewest += begins;
      if (i > 0)
        ASSERT_EQ(quant::block_of(table, size_t(i)), quant::block_of(table, size_t(i - 1)) + (begins ? 1 : 0))
            << "element " << i;
    }
    EXPECT_EQ(blocks.blocks(), fewest);
    most_blocks = std::max(most_blocks, blocks.blocks());
  }
  const ops::QuantizedSize record = chunk_record_size(layout, f);
  EXPECT_EQ(record.scale_count, most_blocks);
  EXPECT_EQ(record.payload_bytes, size_t(f.bits == 8 ? shard : (shard + 1) / 2));
}

TEST(ChunkBlocks, BlocksCoverEachChunkStopAtEveryParameterAndKeepTheParametersGrid) {
  for (ops::QuantFormat f : {ops::QuantFormat{256, 8}, ops::QuantFormat{64, 4}, ops::QuantFormat{5, 8}})
    for (int group = 1; group <= 7; ++group)
      for (int pad_multiple : {group, 12 * group}) check_chunks(FlatLayout(kUnit, group, pad_multiple), f);
}

// A buffer of padding only (a unit whose parameters are all frozen, as its trainable buffer): one piece.
TEST(ChunkBlocks, PaddingOnlyChunksAreOnePiece) {
  const FlatLayout padding({"frozen", {}}, 4);
  for (int c = 0; c < 4; ++c) {
    const ops::HostBlockTable blocks = chunk_blocks(padding, c, {256, 8});
    EXPECT_EQ(blocks.pieces(), 1);
    EXPECT_EQ(blocks.blocks(), 1u);
  }
}

}  // namespace
}  // namespace zshard
