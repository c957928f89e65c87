// BitsTable: the bit-width (1..8) of every element of a [rows, cols] tensor, stored once per
// tensor, per column or per row (BitsLayout). It is what AMAQ learns and what the packer and the
// wire format follow: element (r, c) occupies BitsAt(r, c) bits of the packed payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/scheme.h"

namespace amaq::quant {

struct BitsTable {
  BitsLayout layout = BitsLayout::kUniform;
  std::vector<uint8_t> bits;  // 1 entry (uniform), cols entries (per-channel) or rows entries

  static BitsTable Uniform(int bits);
  static BitsTable PerChannel(std::vector<uint8_t> bits);
  static BitsTable PerToken(std::vector<uint8_t> bits);

  int BitsAt(int64_t row, int64_t col) const {
    switch (layout) {
      case BitsLayout::kUniform: return bits[0];
      case BitsLayout::kPerChannel: return bits[static_cast<size_t>(col)];
      case BitsLayout::kPerToken: return bits[static_cast<size_t>(row)];
    }
    return 0;
  }

  // Throws amaq::Error (kInvalidArgument) unless the table fits a [rows, cols] tensor and every
  // width lies in 1..8.
  void Validate(int64_t rows, int64_t cols) const;

  // Number of entries the table must have for a [rows, cols] tensor under `layout`.
  static int64_t ExpectedEntries(BitsLayout layout, int64_t rows, int64_t cols);

  // Total packed bits of a [rows, cols] tensor (no padding anywhere), and its bytes.
  uint64_t TotalBits(int64_t rows, int64_t cols) const;
  uint64_t PackedBytes(int64_t rows, int64_t cols) const { return (TotalBits(rows, cols) + 7) / 8; }

  // Mean width over all elements: the "average bits" users see.
  double AverageBits(int64_t rows, int64_t cols) const;

  bool operator==(const BitsTable& other) const {
    return layout == other.layout && bits == other.bits;
  }
};

}  // namespace amaq::quant
