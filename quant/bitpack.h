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
  // Writes into [out, out + size): the stream must fit.
  BitWriter(uint8_t* out, size_t size) : out_(out), end_(out + size) {}

  // Appends the low `bits` bits of `value` (value < 2^bits; 1 <= bits <= 64). The word being
  // filled is stored on every call while 8 bytes are left (later calls complete it), and the fill
  // level only selects values: the one branch, on the distance to the end, does not change until
  // the last word, so nothing mispredicts on the data's widths.
  void Put(uint64_t value, int bits) {
    const uint64_t low = acc_ | value << fill_;  // fill_ is in [0, 63]
    const uint64_t spill = (value >> 1) >> (63 - fill_);  // the bits of value beyond the word
    if (end_ - out_ >= 8) std::memcpy(out_, &low, 8);
    fill_ += bits;
    const bool full = fill_ >= 64;  // the low word is complete (it was stored above)
    out_ += full ? 8 : 0;
    acc_ = full ? spill : low;
    fill_ &= 63;
  }

  // True when the bits written so far fill whole bytes.
  bool ByteAligned() const { return fill_ % 8 == 0; }

  // For a byte-aligned stream: returns where its next n bytes go, for the caller to write, and
  // moves past them; *room is the number of bytes from there to the end of the output.
  uint8_t* Skip(size_t n, size_t* room) {
    uint8_t* at = Finish();  // whole bytes: nothing is left held
    *room = static_cast<size_t>(end_ - out_);
    out_ += n;
    return at;
  }

  // The word being filled (stored from here), the bits written into it and those bits, and the
  // bytes from here to the end of the output: for a kernel that writes the stream on from here
  // and then Advances the writer past what it wrote (`words` whole words, `fill` bits of the next
  // one, holding `bits`).
  uint8_t* word() const { return out_; }
  int fill() const { return fill_; }
  uint64_t bits() const { return acc_; }
  size_t room() const { return static_cast<size_t>(end_ - out_); }
  void Advance(uint64_t words, int fill, uint64_t bits) {
    out_ += 8 * words;
    fill_ = fill;
    acc_ = bits;
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
  uint8_t* end_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  // Reads from [in, in + size). Reading past the end yields zero bits and never touches memory
  // outside the range; callers check sizes first (the codec does).
  BitReader(const uint8_t* in, size_t size) : in_(in), end_(in + size) {}
  // Starts `bit` bits into the range (bit <= 8 * size).
  BitReader(const uint8_t* in, size_t size, uint64_t bit) : in_(in + bit / 8), end_(in + size) {
    if (bit % 8 != 0) Get(static_cast<int>(bit % 8));
  }

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

// The widths of one row's columns and the tables that pack and unpack them. A row is packed eight
// codes at a time: a group's codes are joined into one word of up to 64 bits and written with a
// single BitWriter::Put, which gives the same stream as eight separate Puts at a fraction of the
// cost. Under Isa::kAvx512 the joining and the placing of the joined words in the stream run 64
// codes at a time and the unpacking 32 codes at a time (quant/kernels_avx512.h); where every
// group is whole bytes (uniform widths, for one) and the row starts on a byte, the joined words
// are laid out by a byte permutation instead. All paths give the same bytes and codes.
class RowLayout {
 public:
  // Columns take widths[c] bits (per-channel tables) or `uniform` bits each (widths == nullptr).
  RowLayout(const uint8_t* widths, int uniform, int64_t cols);

  // Bits of one packed row.
  uint64_t bits() const { return row_bits_; }

  // Appends the row's codes (code c < 2^width(c)) to the stream.
  void Pack(const uint8_t* codes, BitWriter& writer) const;

  // Reads the row that starts `row_bit` bits into the stream [packed, packed + size) into codes
  // (cols bytes). The row must lie inside the stream (the codec checks sizes first).
  void Unpack(const uint8_t* packed, size_t size, uint64_t row_bit, uint8_t* codes) const;

 private:
  static constexpr int kGroup = 8;   // codes per joined word
  static constexpr int kBlock = 64;  // codes per AVX-512 join
  static constexpr int kChunk = 32;  // codes per AVX-512 extraction (whole groups)
  struct Group {
    uint8_t shift[kGroup];  // bit offset of each code in the group's word (shift[0] = 0)
    uint8_t mask[kGroup];   // 2^width - 1 of each code
    uint8_t width;          // total bits of the group: 8..64
  };
  void BuildSimdTables();
  void PackGroups(const uint8_t* codes, int64_t first, BitWriter& writer) const;

  int64_t cols_;
  uint64_t row_bits_ = 0;
  std::vector<uint8_t> widths_;
  std::vector<Group> groups_;
  // AVX-512 joining, per block of 64 codes: the width of the first code of each pair, of the
  // first pair of each quad, of the first quad of each group.
  std::vector<uint16_t> pair_shift_;
  std::vector<uint32_t> quad_shift_;
  std::vector<uint64_t> group_shift_;
  // AVX-512 deposit: each blocked group's first bit in the row, and the blocks' bits in all.
  std::vector<uint64_t> group_bit_;
  uint64_t blocked_bits_ = 0;
  // Where every group of the blocks is whole bytes: per block, the byte of its words that becomes
  // each of its output bytes (64 entries) and its byte count; empty otherwise.
  std::vector<uint8_t> block_gather_;
  std::vector<uint8_t> block_bytes_;
  size_t blocked_bytes_ = 0;
  // AVX-512 extraction, per chunk of 32 codes: its first bit in the row (one more entry: where the
  // codes after the last whole chunk start), and each code's bit offset in it and mask.
  std::vector<uint32_t> chunk_start_;
  std::vector<uint16_t> chunk_offset_;
  std::vector<uint16_t> chunk_mask_;
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
