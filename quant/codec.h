// The wire codec: a [rows, cols] fp32 tensor <-> self-describing bytes (docs/wire-format.md).
//
// A message holds a fixed header (version, scheme, granularity, shape, ...), the bits table (or a
// reference to the table of the previous message of the same stream), the scales, the payload
// (packed codes or raw 16/32-bit floats, optionally zstd-compressed) and a checksum of all of it.
//
// Encoder and Decoder are one stream each: an Encoder omits a bits table identical to the one it
// sent last, and the Decoder resolves the reference by the table's id (a hash of its entries). A Decoder that does not
// hold that table (it was restarted, or a message was lost) throws kFailedPrecondition; the sender
// then calls Encoder::Reset() and sends again. Decode validates every field and length, never
// reads out of bounds, and throws amaq::Error for anything malformed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "quant/bits_table.h"
#include "quant/scheme.h"

namespace amaq::quant {

struct EncodeOptions {
  Scheme scheme = Scheme::kAffine;
  Granularity granularity = Granularity::kChannel;
  int group_size = 128;                             // Granularity::kGroup only
  ScaleFormat scale_format = ScaleFormat::kFloat16;  // falls back to fp32 when a scale does not fit
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // stochastic rounding
  bool zstd = false;  // compress the payload (kept only when it gets smaller)
  int zstd_level = 1;
};

// Bytes of one or more messages: what a user plots accuracy against.
struct ByteCount {
  uint64_t payload = 0;   // codes or raw values as sent (after zstd, if used)
  uint64_t metadata = 0;  // header, bits table, scales, checksum
  uint64_t total() const { return payload + metadata; }
  ByteCount& operator+=(const ByteCount& other) {
    payload += other.payload;
    metadata += other.metadata;
    return *this;
  }
};

struct Encoded {
  std::vector<uint8_t> bytes;
  ByteCount count;
  double average_bits = 0;  // bits per element actually sent in codes (32 or 16 for float schemes)
};

struct Decoded {
  int64_t rows = 0;
  int64_t cols = 0;
  Scheme scheme = Scheme::kFloat32;
  Granularity granularity = Granularity::kTensor;
  BitsTable bits;  // empty for float schemes
  std::vector<float> values;  // rows * cols, row-major
  ByteCount count;
};

struct DecodeLimits {
  uint64_t max_elements = uint64_t{1} << 28;  // larger tensors are refused (kResourceExhausted)
};

// The one shape a receiver accepts (from the step that carries the message): checked on the
// header, before anything is decompressed or allocated. -1: any.
struct ExpectedShape {
  int64_t rows = -1, cols = -1;
};

class Encoder {
 public:
  // Encodes x [rows, cols]; `bits` is ignored by float schemes. When `reconstruction` is not null it
  // receives rows * cols floats: bit for bit what a Decoder makes of the returned bytes.
  // Throws amaq::Error (kInvalidArgument) on NaN/inf input or an invalid option combination.
  Encoded Encode(const float* x, int64_t rows, int64_t cols, const BitsTable& bits,
                 const EncodeOptions& options, float* reconstruction = nullptr);
  // Same, reusing out->bytes' memory: the form for a steady stream of same-sized messages.
  void Encode(const float* x, int64_t rows, int64_t cols, const BitsTable& bits,
              const EncodeOptions& options, Encoded* out, float* reconstruction = nullptr);
  // Forgets the last bits table: the next message carries its table in full.
  void Reset() { last_table_id_.reset(); }

 private:
  std::optional<uint32_t> last_table_id_;
};

class Decoder {
 public:
  explicit Decoder(DecodeLimits limits = {}) : limits_(limits) {}
  Decoded Decode(const uint8_t* data, size_t size);
  // Same, reusing out->values' memory: the form for a steady stream of same-sized messages. A
  // message of another shape than `shape` is refused (kInvalidArgument) from its header.
  void Decode(const uint8_t* data, size_t size, Decoded* out, ExpectedShape shape = {});
  void Reset() { last_table_.reset(); }

 private:
  DecodeLimits limits_;
  std::optional<std::pair<uint32_t, BitsTable>> last_table_;  // (id, table) of the last message
};

// The id of a bits table on the wire: the low 32 bits of WireChecksum(layout byte, entries).
uint32_t BitsTableId(const BitsTable& bits);

}  // namespace amaq::quant
