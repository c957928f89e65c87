#include "quant/bitpack.h"

#include <string>

#include "common/base/error.h"

namespace amaq::quant {

RowLayout::RowLayout(const uint8_t* widths, int uniform, int64_t cols)
    : cols_(cols), widths_(static_cast<size_t>(cols)) {
  for (int64_t c = 0; c < cols; ++c) {
    widths_[static_cast<size_t>(c)] = widths ? widths[c] : static_cast<uint8_t>(uniform);
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
}

RowLayout RowLayoutOf(const BitsTable& bits, int64_t row, int64_t cols) {
  return bits.layout == BitsLayout::kPerChannel ? RowLayout(bits.bits.data(), 0, cols)
                                                : RowLayout(nullptr, bits.BitsAt(row, 0), cols);
}

void PackCodes(const uint8_t* codes, int64_t rows, int64_t cols, const BitsTable& bits,
               uint8_t* out) {
  bits.Validate(rows, cols);
  BitWriter writer(out);
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
  BitReader reader(packed, packed_size);
  RowLayout layout = RowLayoutOf(bits, 0, cols);
  for (int64_t r = 0; r < rows; ++r) {
    if (bits.layout == BitsLayout::kPerToken && r > 0) layout = RowLayoutOf(bits, r, cols);
    layout.Unpack(reader, codes + r * cols);
  }
}

}  // namespace amaq::quant
