#include "quant/bitpack.h"

#include <algorithm>
#include <string>

#include "common/base/error.h"
#include "quant/isa.h"
#include "quant/kernels_avx512.h"

namespace amaq::quant {

RowLayout::RowLayout(const uint8_t* widths, int uniform, int64_t cols)
    : cols_(cols), widths_(static_cast<size_t>(cols)) {
  for (int64_t c = 0; c < cols; ++c) {
    widths_[static_cast<size_t>(c)] = widths ? widths[c] : static_cast<uint8_t>(uniform);
    row_bits_ += widths_[static_cast<size_t>(c)];
  }
  groups_.resize(static_cast<size_t>(cols / kGroup));
  for (size_t k = 0; k < groups_.size(); ++k) {
    const uint8_t* w = widths_.data() + kGroup * k;
    Group& g = groups_[k];
    int offset = 0;
    for (int j = 0; j < kGroup; ++j) {
      g.shift[j] = static_cast<uint8_t>(offset);
      g.mask[j] = static_cast<uint8_t>((1u << w[j]) - 1u);
      offset += w[j];
    }
    g.width = static_cast<uint8_t>(offset);
  }
  if (ActiveIsa() == Isa::kAvx512) BuildSimdTables();
}

void RowLayout::BuildSimdTables() {
  const auto w = [&](int64_t c) { return widths_[static_cast<size_t>(c)]; };
  const int64_t blocked = cols_ / kBlock * kBlock;
  for (int64_t c = 0; c < blocked; c += 2) pair_shift_.push_back(w(c));
  for (int64_t c = 0; c < blocked; c += 4) quad_shift_.push_back(static_cast<uint32_t>(w(c) + w(c + 1)));
  for (int64_t c = 0; c < blocked; c += 8) {
    group_shift_.push_back(static_cast<uint64_t>(w(c) + w(c + 1) + w(c + 2) + w(c + 3)));
  }
  for (int64_t k = 0; k < blocked / kGroup; ++k) {
    group_bit_.push_back(blocked_bits_);
    blocked_bits_ += groups_[static_cast<size_t>(k)].width;
  }
  const bool whole_bytes = std::all_of(groups_.begin(), groups_.begin() + blocked / kGroup,
                                      [](const Group& g) { return g.width % 8 == 0; });
  for (int64_t b = 0; whole_bytes && b < blocked / kBlock; ++b) {
    size_t t = 0;
    for (int k = 0; k < kGroup; ++k) {
      for (int j = 0; j < groups_[static_cast<size_t>(b * kGroup + k)].width / 8; ++j) {
        block_gather_.push_back(static_cast<uint8_t>(8 * k + j));
        ++t;
      }
    }
    block_gather_.resize(block_gather_.size() + 64 - t, 0);
    block_bytes_.push_back(static_cast<uint8_t>(t));
    blocked_bytes_ += t;
  }
  uint32_t bit = 0;
  for (int64_t c0 = 0; c0 + kChunk <= cols_; c0 += kChunk) {
    chunk_start_.push_back(bit);
    uint16_t offset = 0;
    for (int64_t c = c0; c < c0 + kChunk; ++c) {
      chunk_offset_.push_back(offset);
      chunk_mask_.push_back(static_cast<uint16_t>((1u << w(c)) - 1u));
      offset = static_cast<uint16_t>(offset + w(c));
    }
    bit += offset;
  }
  chunk_start_.push_back(bit);
}

void RowLayout::PackGroups(const uint8_t* codes, int64_t first, BitWriter& writer) const {
  const int64_t full = cols_ / kGroup;
  for (int64_t k = first; k < full; ++k) {
    const uint8_t* c = codes + kGroup * k;
    const Group& g = groups_[static_cast<size_t>(k)];
    uint64_t word = c[0];
    for (int j = 1; j < kGroup; ++j) word |= static_cast<uint64_t>(c[j]) << g.shift[j];
    writer.Put(word, g.width);
  }
  for (int64_t c = kGroup * full; c < cols_; ++c) writer.Put(codes[c], widths_[static_cast<size_t>(c)]);
}

void RowLayout::Pack(const uint8_t* codes, BitWriter& writer) const {
  int64_t groups_done = 0;
  if (ActiveIsa() == Isa::kAvx512 && !group_shift_.empty()) {
    const int64_t blocks = cols_ / kBlock;
    if (!block_bytes_.empty() && writer.ByteAligned()) {
      size_t room = 0;
      uint8_t* at = writer.Skip(blocked_bytes_, &room);
      avx512::PackByteAlignedBlocks(codes, blocks, pair_shift_.data(), quad_shift_.data(),
                                    group_shift_.data(), block_gather_.data(), block_bytes_.data(),
                                    at, room);
    } else {
      const avx512::BitCursor end = avx512::DepositBlocks(
          codes, blocks, pair_shift_.data(), quad_shift_.data(), group_shift_.data(),
          group_bit_.data(), blocked_bits_, writer.word(), writer.room(), writer.fill(), writer.bits());
      writer.Advance(end.word, end.fill, end.bits);
    }
    groups_done = blocks * kGroup;
  }
  PackGroups(codes, groups_done, writer);
}

void RowLayout::Unpack(const uint8_t* packed, size_t size, uint64_t row_bit, uint8_t* codes) const {
  int64_t groups_done = 0;
  uint64_t bit = row_bit;
  if (ActiveIsa() == Isa::kAvx512 && !chunk_start_.empty()) {
    const int64_t chunks = static_cast<int64_t>(chunk_start_.size()) - 1;
    avx512::ExtractChunks(packed, size, row_bit, chunks, chunk_start_.data(), chunk_offset_.data(),
                          chunk_mask_.data(), codes);
    groups_done = chunks * (kChunk / kGroup);
    bit += chunk_start_.back();
  }
  BitReader reader(packed, size, bit);
  const int64_t full = cols_ / kGroup;
  for (int64_t k = groups_done; k < full; ++k) {
    const Group& g = groups_[static_cast<size_t>(k)];
    const uint64_t word = reader.Get(g.width);
    uint8_t* c = codes + kGroup * k;
    for (int j = 0; j < kGroup; ++j) c[j] = static_cast<uint8_t>((word >> g.shift[j]) & g.mask[j]);
  }
  for (int64_t c = kGroup * full; c < cols_; ++c) {
    codes[c] = static_cast<uint8_t>(reader.Get(widths_[static_cast<size_t>(c)]));
  }
}

RowLayout RowLayoutOf(const BitsTable& bits, int64_t row, int64_t cols) {
  return bits.layout == BitsLayout::kPerChannel ? RowLayout(bits.bits.data(), 0, cols)
                                                : RowLayout(nullptr, bits.BitsAt(row, 0), cols);
}

void PackCodes(const uint8_t* codes, int64_t rows, int64_t cols, const BitsTable& bits,
               uint8_t* out) {
  bits.Validate(rows, cols);
  BitWriter writer(out, bits.PackedBytes(rows, cols));
  RowLayout layout = RowLayoutOf(bits, 0, cols);
  for (int64_t r = 0; r < rows; ++r) {
    if (bits.layout == BitsLayout::kPerToken && r > 0) layout = RowLayoutOf(bits, r, cols);
    layout.Pack(codes + r * cols, writer);
  }
  writer.Finish();
}

void UnpackCodes(const uint8_t* packed, size_t packed_size, int64_t rows, int64_t cols,
                 const BitsTable& bits, uint8_t* codes) {
  bits.Validate(rows, cols);
  const uint64_t expected = bits.PackedBytes(rows, cols);
  Require(packed_size == expected, ErrorCode::kDataLoss,
          "packed payload has " + std::to_string(packed_size) + " bytes but the shape and bits "
          "table need " + std::to_string(expected) + ": the message is truncated or corrupted");
  RowLayout layout = RowLayoutOf(bits, 0, cols);
  uint64_t row_bit = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (bits.layout == BitsLayout::kPerToken && r > 0) layout = RowLayoutOf(bits, r, cols);
    layout.Unpack(packed, packed_size, row_bit, codes + r * cols);
    row_bit += layout.bits();
  }
}

}  // namespace amaq::quant
