// Dense mixed-bit packing (docs/wire-format.md, "Payload").
//
// Codes are written in row-major element order as one little-endian bit stream: element i takes
// the next BitsAt(row, col) bits, least significant bit first, where stream bit k is bit (k % 8) of
// byte k / 8. There is no padding between elements or rows; the last byte is zero-filled.
// BitWriter and BitReader are the streaming primitives (inline: they are the codec's inner loop);
// RowLayout packs a row four codes at a time; PackCodes and UnpackCodes apply it to a whole
// tensor of one-byte codes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/bits_table.h"

namespace amaq::quant {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the bit packer stores 32-bit words as they lie in memory: port it before using a "
              "big-endian machine");

class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}

  // Appends the low `bits` bits of `code` (code must be < 2^bits; 1 <= bits <= 32).
  void Put(uint32_t code, int bits) {
    acc_ |= static_cast<uint64_t>(code) << fill_;
    fill_ += bits;
    if (fill_ >= 32) {
      const auto word = static_cast<uint32_t>(acc_);
      std::memcpy(out_, &word, 4);
      out_ += 4;
      acc_ >>= 32;
      fill_ -= 32;
    }
  }

  // Writes the bits still held (zero-filling the last byte); returns one past the last byte.
  uint8_t* Finish() {
    while (fill_ > 0) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      fill_ = fill_ > 8 ? fill_ - 8 : 0;
    }
    return out_;
  }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  // Reads from [in, in + size). Reading past the end yields zero bits, never touches memory
  // outside the range; callers check sizes first (the codec does).
  BitReader(const uint8_t* in, size_t size) : in_(in), end_(in + size) {}

  // Returns the next `bits` bits (1 <= bits <= 32).
  uint32_t Get(int bits) {
    if (fill_ < bits) Refill();
    const auto value = static_cast<uint32_t>(acc_ & ((uint64_t{1} << bits) - 1u));
    acc_ >>= bits;
    fill_ -= bits;
    return value;
  }

 private:
  void Refill() {
    if (end_ - in_ >= 4) {
      uint32_t word;
      std::memcpy(&word, in_, 4);
      acc_ |= static_cast<uint64_t>(word) << fill_;
      in_ += 4;
      fill_ += 32;
      return;
    }
    while (fill_ <= 56 && in_ < end_) {
      acc_ |= static_cast<uint64_t>(*in_++) << fill_;
      fill_ += 8;
    }
    if (in_ == end_ && fill_ < 32) fill_ = 32;  // past the end: zero bits
  }

  const uint8_t* in_;
  const uint8_t* end_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// The widths of one row's columns, grouped four at a time: a group's codes are joined into one
// word of up to 32 bits and written with a single BitWriter::Put, which gives the same stream as
// four separate Puts at a quarter of the cost.
class RowLayout {
 public:
  // Columns take widths[c] bits (per-channel tables) or `uniform` bits each (widths == nullptr).
  RowLayout(const uint8_t* widths, int uniform, int64_t cols);

  void Pack(const uint8_t* codes, BitWriter& writer) const {
    const int64_t full = cols_ / 4;
    for (int64_t k = 0; k < full; ++k) {
      const uint8_t* c = codes + 4 * k;
      const Group& g = groups_[static_cast<size_t>(k)];
      writer.Put(c[0] | (uint32_t{c[1]} << g.shift1) | (uint32_t{c[2]} << g.shift2) |
                     (uint32_t{c[3]} << g.shift3),
                 g.width);
    }
    for (int64_t c = 4 * full; c < cols_; ++c) writer.Put(codes[c], widths_[static_cast<size_t>(c)]);
  }

  void Unpack(BitReader& reader, uint8_t* codes) const {
    const int64_t full = cols_ / 4;
    for (int64_t k = 0; k < full; ++k) {
      const Group& g = groups_[static_cast<size_t>(k)];
      const uint32_t word = reader.Get(g.width);
      uint8_t* c = codes + 4 * k;
      c[0] = static_cast<uint8_t>(word & g.mask0);
      c[1] = static_cast<uint8_t>((word >> g.shift1) & g.mask1);
      c[2] = static_cast<uint8_t>((word >> g.shift2) & g.mask2);
      c[3] = static_cast<uint8_t>((word >> g.shift3) & g.mask3);
    }
    for (int64_t c = 4 * full; c < cols_; ++c) {
      codes[c] = static_cast<uint8_t>(reader.Get(widths_[static_cast<size_t>(c)]));
    }
  }

 private:
  struct Group {
    uint8_t shift1, shift2, shift3, width;
    uint32_t mask0, mask1, mask2, mask3;
  };
  int64_t cols_;
  std::vector<uint8_t> widths_;
  std::vector<Group> groups_;
};

// The layout of row `row` of a [rows, cols] tensor under `bits` (valid for the shape).
RowLayout RowLayoutOf(const BitsTable& bits, int64_t row, int64_t cols);

// Packs rows*cols one-byte codes (code < 2^BitsAt) into `out`, which must hold
// bits.PackedBytes(rows, cols) bytes. The table must be valid for the shape.
void PackCodes(const uint8_t* codes, int64_t rows, int64_t cols, const BitsTable& bits,
               uint8_t* out);

// Inverse of PackCodes. `packed_size` must equal bits.PackedBytes(rows, cols) (amaq::Error
// kDataLoss otherwise).
void UnpackCodes(const uint8_t* packed, size_t packed_size, int64_t rows, int64_t cols,
                 const BitsTable& bits, uint8_t* codes);

}  // namespace amaq::quant
