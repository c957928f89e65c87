#include "quant/bitpack.h"

#include <string>

#include "common/error.h"

namespace amaq::quant {

RowLayout::RowLayout(const uint8_t* widths, int uniform, int64_t cols)
    : cols_(cols), widths_(static_cast<size_t>(cols)) {
  for (int64_t c = 0; c < cols; ++c) {
    widths_[static_cast<size_t>(c)] = widths ? widths[c] : static_cast<uint8_t>(uniform);
  }
  groups_.resize(static_cast<size_t>(cols / 4));
  for (size_t k = 0; k < groups_.size(); ++k) {
    const uint8_t* w = widths_.data() + 4 * k;
    Group& g = groups_[k];
    g.shift1 = w[0];
    g.shift2 = static_cast<uint8_t>(w[0] + w[1]);
    g.shift3 = static_cast<uint8_t>(w[0] + w[1] + w[2]);
    g.width = static_cast<uint8_t>(w[0] + w[1] + w[2] + w[3]);
    g.mask0 = (1u << w[0]) - 1u;
    g.mask1 = (1u << w[1]) - 1u;
    g.mask2 = (1u << w[2]) - 1u;
    g.mask3 = (1u << w[3]) - 1u;
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
