#include "quant/bitpack.h"

#include <string>

#include "common/error.h"

namespace amaq::quant {

void PackCodes(const uint8_t* codes, int64_t rows, int64_t cols, const BitsTable& bits,
               uint8_t* out) {
  bits.Validate(rows, cols);
  BitWriter writer(out);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = codes + r * cols;
    for (int64_t c = 0; c < cols; ++c) writer.Put(row[c], bits.BitsAt(r, c));
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
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = codes + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] = static_cast<uint8_t>(reader.Get(bits.BitsAt(r, c)));
  }
}

}  // namespace amaq::quant
