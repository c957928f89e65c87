// Dense mixed-bit packing (docs/wire-format.md, "Payload").
//
// Codes are written in row-major element order as one little-endian bit stream: element i takes
// the next BitsAt(row, col) bits, least significant bit first, where stream bit k is bit (k % 8) of
// byte k / 8. There is no padding between elements or rows; the last byte is zero-filled.
// BitWriter and BitReader are the streaming primitives (inline: they are the codec's inner loop);
// RowLayout packs a row eight codes at a time; PackCodes and UnpackCodes apply it to a whole
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

  // Appends the low `bits` bits of `value` (value < 2^bits; 1 <= bits <= 64).
  void Put(uint64_t value, int bits) {
    acc_ |= value << fill_;  // fill_ is in [0, 63]
    if (fill_ + bits >= 64) {
      std::memcpy(out_, &acc_, 8);
      out_ += 8;
      acc_ = (value >> 1) >> (63 - fill_);  // the bits of value that did not fit (0 if fill_ == 0)
      fill_ += bits - 64;
    } else {
      fill_ += bits;
    }
  }

  // Writes the bits still held (zero-filling the last byte); returns one past the last byte.
  uint8_t* Finish() {
    for (; fill_ > 0; fill_ = fill_ > 8 ? fill_ - 8 : 0) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
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
  // Reads from [in, in + size). Reading past the end yields zero bits and never touches memory
  // outside the range; callers check sizes first (the codec does).
  BitReader(const uint8_t* in, size_t size) : in_(in), end_(in + size) {}

  // Returns the next `bits` bits (1 <= bits <= 64).
  uint64_t Get(int bits) {
    const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    if (fill_ >= bits) {
      const uint64_t value = acc_ & mask;
      acc_ = bits == 64 ? 0 : acc_ >> bits;
      fill_ -= bits;
      return value;
    }
    const uint64_t word = NextWord();
    const uint64_t value = (acc_ | (word << fill_)) & mask;  // fill_ < bits <= 64
    const int taken = bits - fill_;                            // from word: 1..64
    acc_ = taken == 64 ? 0 : word >> taken;
    fill_ = 64 - taken;
    return value;
  }

 private:
  uint64_t NextWord() {
    uint64_t word = 0;
    if (end_ - in_ >= 8) {
      std::memcpy(&word, in_, 8);
      in_ += 8;
    } else {
      for (int shift = 0; in_ < end_; shift += 8) word |= static_cast<uint64_t>(*in_++) << shift;
    }
    return word;
  }

  const uint8_t* in_;
  const uint8_t* end_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// The widths of one row's columns, grouped eight at a time: a group's codes are joined into one
// word of up to 64 bits and written with a single BitWriter::Put, which gives the same stream as
// eight separate Puts at a fraction of the cost.
class RowLayout {
 public:
  // Columns take widths[c] bits (per-channel tables) or `uniform` bits each (widths == nullptr).
  RowLayout(const uint8_t* widths, int uniform, int64_t cols);

  void Pack(const uint8_t* codes, BitWriter& writer) const {
    const int64_t full = cols_ / kGroup;
    for (int64_t k = 0; k < full; ++k) {
      const uint8_t* c = codes + kGroup * k;
      const Group& g = groups_[static_cast<size_t>(k)];
      uint64_t word = c[0];
      for (int j = 1; j < kGroup; ++j) word |= static_cast<uint64_t>(c[j]) << g.shift[j];
      writer.Put(word, g.width);
    }
    for (int64_t c = kGroup * full; c < cols_; ++c) {
      writer.Put(codes[c], widths_[static_cast<size_t>(c)]);
    }
  }

  void Unpack(BitReader& reader, uint8_t* codes) const {
    const int64_t full = cols_ / kGroup;
    for (int64_t k = 0; k < full; ++k) {
      const Group& g = groups_[static_cast<size_t>(k)];
      const uint64_t word = reader.Get(g.width);
      uint8_t* c = codes + kGroup * k;
      for (int j = 0; j < kGroup; ++j) c[j] = static_cast<uint8_t>((word >> g.shift[j]) & g.mask[j]);
    }
    for (int64_t c = kGroup * full; c < cols_; ++c) {
      codes[c] = static_cast<uint8_t>(reader.Get(widths_[static_cast<size_t>(c)]));
    }
  }

 private:
  static constexpr int kGroup = 8;
  struct Group {
    uint8_t shift[kGroup];  // bit offset of each code in the group's word (shift[0] = 0)
    uint8_t mask[kGroup];   // 2^width - 1 of each code
    uint8_t width;          // total bits of the group: 8..64
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
