#include "quant/codec.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/base/error.h"
#include "quant/bitpack.h"
#include "quant/byte_io.h"
#include "quant/checksum.h"
#include "quant/grid.h"
#include "common/base/half.h"
#include "quant/isa.h"
#include "quant/kernels_avx512.h"
#include "quant/kernels.h"

namespace amaq::quant {
namespace {

constexpr uint32_t kMagic = 0x54514d41;  // "AMQT" as bytes on the wire
constexpr uint8_t kVersion = 1;
constexpr uint8_t kFlagZstd = 1;
constexpr uint8_t kFlagTableIncluded = 2;
constexpr size_t kHeaderSize = 48;
constexpr size_t kFlagsOffset = 9, kPayloadSizeOffset = 40;  // of the header's fields patched after the payload
constexpr size_t kChecksumSize = 8;

size_t FloatSchemeWidth(Scheme s) { return s == Scheme::kFloat32 ? 4 : 2; }

// Calls fn(begin, n, group) for each run of columns of row r that shares one scale group.
// Not used for per-channel granularity, whose rows take the per-channel kernels.
template <typename Fn>
void ForEachRun(const GridSpec& spec, int64_t r, int64_t cols, Fn fn) {
  switch (spec.granularity) {
    case Granularity::kTensor: fn(int64_t{0}, cols, int64_t{0}); return;
    case Granularity::kToken: fn(int64_t{0}, cols, r); return;
    case Granularity::kGroup: {
      const int64_t per_row = (cols + spec.group_size - 1) / spec.group_size;
      for (int64_t k = 0; k < per_row; ++k) {
        const int64_t begin = k * spec.group_size;
        fn(begin, std::min<int64_t>(spec.group_size, cols - begin), r * per_row + k);
      }
      return;
    }
    case Granularity::kChannel: return;
  }
}

std::vector<float> ChannelMaxCodes(Scheme scheme, const BitsTable& bits, int64_t cols) {
  std::vector<float> max_codes(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    max_codes[static_cast<size_t>(c)] = static_cast<float>(MaxCode(scheme, bits.BitsAt(0, c)));
  }
  return max_codes;
}

std::vector<float> Reciprocals(const std::vector<float>& steps) {
  std::vector<float> inv(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) inv[i] = 1.0f / steps[i];
  return inv;
}

// Keeps `layout` equal to RowLayoutOf(bits, r, cols); only per-token tables change between rows.
void UpdateRowLayout(const BitsTable& bits, int64_t r, int64_t cols, RowLayout* layout) {
  if (bits.layout == BitsLayout::kPerToken && r > 0 &&
      bits.bits[static_cast<size_t>(r)] != bits.bits[static_cast<size_t>(r - 1)]) {
    *layout = RowLayoutOf(bits, r, cols);
  }
}

void QuantizeAndPack(const float* x, int64_t rows, int64_t cols, const GridSpec& spec,
                     const BitsTable& bits, const ScaleGrid& grid, const EncodeOptions& options,
                     uint8_t* out, float* reconstruction) {
  // Rows go through in passes of kPassRows: per-channel scales are then read once per pass.
  constexpr int64_t kPassRows = 4;
  std::vector<uint8_t> pass_codes(static_cast<size_t>(kPassRows * cols));
  const bool per_channel = spec.granularity == Granularity::kChannel;
  const std::vector<float> max_codes =
      per_channel ? ChannelMaxCodes(spec.scheme, bits, cols) : std::vector<float>();
  const std::vector<float> inv_steps = Reciprocals(grid.steps);
  const bool stochastic = options.rounding == Rounding::kStochastic;
  uint64_t rng = options.seed;
  const float* zeros = grid.zeros.data();
  const float* steps = grid.steps.data();
  RowLayout layout = RowLayoutOf(bits, 0, cols);
  BitWriter writer(out, bits.PackedBytes(rows, cols));
  for (int64_t r0 = 0; r0 < rows; r0 += kPassRows) {
    const int64_t pass_rows = std::min(kPassRows, rows - r0);
    if (per_channel && !stochastic) {
      QuantizeRowsPerChannel(x + r0 * cols, pass_rows, cols, zeros, inv_steps.data(), max_codes.data(),
                             pass_codes.data());
    }
    for (int64_t r = r0; r < r0 + pass_rows; ++r) {
      const float* xr = x + r * cols;
      uint8_t* codes = pass_codes.data() + (r - r0) * cols;
      float* recon_row = reconstruction ? reconstruction + r * cols : nullptr;
      if (per_channel) {
        if (stochastic) {
          QuantizeRowPerChannelStochastic(xr, cols, zeros, inv_steps.data(), max_codes.data(), &rng,
                                          codes);
        }
        if (recon_row) DequantizeRowPerChannel(codes, cols, zeros, steps, recon_row);
      } else {
        ForEachRun(spec, r, cols, [&](int64_t begin, int64_t n, int64_t g) {
          const auto max_code = static_cast<float>(MaxCode(spec.scheme, bits.BitsAt(r, begin)));
          if (stochastic) {
            QuantizeRunStochastic(xr + begin, n, zeros[g], inv_steps[g], max_code, &rng, codes + begin);
          } else {
            QuantizeRun(xr + begin, n, zeros[g], inv_steps[g], max_code, codes + begin);
          }
          if (recon_row) DequantizeRun(codes + begin, n, zeros[g], steps[g], recon_row + begin);
        });
      }
      UpdateRowLayout(bits, r, cols, &layout);
      layout.Pack(codes, writer);
    }
  }
  writer.Finish();
}

// Symmetric codes stop at 2^b - 2 (docs/wire-format.md): throws amaq::Error (kDataLoss) for a
// row of `codes` that holds 2^b - 1. `max_codes` is refreshed when row r's widths differ.
void CheckSymmetricRow(const uint8_t* codes, int64_t r, int64_t cols, const BitsTable& bits, std::vector<uint8_t>* max_codes) {
  if (r == 0 || bits.layout == BitsLayout::kPerToken) {
    for (int64_t c = 0; c < cols; ++c) (*max_codes)[static_cast<size_t>(c)] = static_cast<uint8_t>(MaxCode(Scheme::kSymmetric, bits.BitsAt(r, c)));
  }
  const uint8_t* max = max_codes->data();
  uint8_t over = 0;  // a branch-free pass the compiler vectorizes; the culprit is looked for only on failure
  for (int64_t c = 0; c < cols; ++c) over |= static_cast<uint8_t>(codes[c] > max[c]);
  if (!over) return;
  int64_t c = 0;
  while (codes[c] <= max[c]) ++c;
  throw Error(ErrorCode::kDataLoss, "symmetric code " + std::to_string(codes[c]) + " at (" + std::to_string(r) + ", " +
                                        std::to_string(c) + ") is above 2^b - 2: the message is corrupted");
}

void UnpackAndDequantize(const uint8_t* packed, size_t size, int64_t rows, int64_t cols,
                         const GridSpec& spec, const BitsTable& bits, const ScaleGrid& grid,
                         float* out) {
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  std::vector<uint8_t> max_codes(spec.scheme == Scheme::kSymmetric ? static_cast<size_t>(cols) : 0);
  const float* zeros = grid.zeros.data();
  const float* steps = grid.steps.data();
  // An output beyond this is not read back from the caches anyway: write it around them.
  constexpr uint64_t kBypassCacheBytes = uint64_t{16} << 20;
  const bool bypass_cache = static_cast<uint64_t>(rows * cols) * sizeof(float) >= kBypassCacheBytes;
  RowLayout layout = RowLayoutOf(bits, 0, cols);
  uint64_t row_bit = 0;
  for (int64_t r = 0; r < rows; ++r) {
    UpdateRowLayout(bits, r, cols, &layout);
    layout.Unpack(packed, size, row_bit, codes.data());
    row_bit += layout.bits();
    if (spec.scheme == Scheme::kSymmetric) CheckSymmetricRow(codes.data(), r, cols, bits, &max_codes);
    float* row = out + r * cols;
    if (spec.granularity == Granularity::kChannel) {
      DequantizeRowPerChannel(codes.data(), cols, zeros, steps, row, bypass_cache);
    } else {
      ForEachRun(spec, r, cols, [&](int64_t begin, int64_t n, int64_t g) {
        DequantizeRun(codes.data() + begin, n, zeros[g], steps[g], row + begin);
      });
    }
  }
}

// Writes n finite floats in a float scheme. Throws amaq::Error (kInvalidArgument) for a value
// beyond the 16-bit format's range (it would arrive as infinity).
void WriteFloats(const float* x, uint64_t n, Scheme scheme, uint8_t* out, float* reconstruction) {
  if (n == 0) return;  // x and out may be null
  if (scheme == Scheme::kFloat32) {
    std::memcpy(out, x, n * sizeof(float));
    if (reconstruction) std::memcpy(reconstruction, x, n * sizeof(float));
    return;
  }
  const uint16_t infinity = scheme == Scheme::kBFloat16 ? 0x7f80 : 0x7c00;  // the exponent bits
  uint64_t i = 0;  // the vector kernel stops where a value overflows: the loop below reports it
  if (ActiveIsa() == Isa::kAvx512) {
    i = static_cast<uint64_t>(avx512::NarrowFloats(x, static_cast<int64_t>(n), scheme == Scheme::kBFloat16, out, reconstruction));
  }
  for (; i < n; ++i) {
    const uint16_t h = scheme == Scheme::kBFloat16 ? FloatToBFloat16(x[i]) : FloatToHalf(x[i]);
    if ((h & infinity) == infinity) {  // not Require: its message would be built for every element
      throw Error(ErrorCode::kInvalidArgument, "value " + std::to_string(x[i]) + " at element " + std::to_string(i) +
                                                   " is beyond the range of " + ToString(scheme) +
                                                   ": send it as fp32 (or bf16 instead of fp16), or with a quantized method");
    }
    std::memcpy(out + 2 * i, &h, 2);
    if (reconstruction) reconstruction[i] = scheme == Scheme::kBFloat16 ? BFloat16ToFloat(h) : HalfToFloat(h);
  }
}

void ReadFloats(const uint8_t* in, uint64_t n, Scheme scheme, float* out) {
  if (n == 0) return;  // in and out may be null
  if (scheme == Scheme::kFloat32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  if (ActiveIsa() == Isa::kAvx512) {
    avx512::WidenFloats(in, static_cast<int64_t>(n), scheme == Scheme::kBFloat16, out);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = scheme == Scheme::kBFloat16 ? BFloat16ToFloat(h) : HalfToFloat(h);
  }
}

void PutScale(ByteWriter& w, ScaleFormat format, float value) {
  if (format == ScaleFormat::kFloat16) {
    w.Put(FloatToHalf(value));  // exact: grid values are representable
  } else {
    w.Put(value);
  }
}

float GetScale(ByteReader& r, ScaleFormat format, const char* field) {
  return format == ScaleFormat::kFloat16 ? HalfToFloat(r.Get<uint16_t>(field)) : r.Get<float>(field);
}

std::string ShapeText(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

// Compresses the payload of `message` (at `payload_at`, `raw_size` bytes) in place with zstd when
// that makes it smaller, flagging it and patching the header's payload size; returns its size.
uint64_t CompressPayload(std::vector<uint8_t>* message, size_t payload_at, uint64_t raw_size, int level) {
  if (raw_size == 0) return 0;
  uint8_t* payload = message->data() + payload_at;
  std::vector<uint8_t> compressed(ZSTD_compressBound(raw_size));
  const size_t n = ZSTD_compress(compressed.data(), compressed.size(), payload, raw_size, level);
  Require(!ZSTD_isError(n), ErrorCode::kInternal, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  if (n >= raw_size) return raw_size;
  std::memcpy(payload, compressed.data(), n);
  const uint64_t size = n;
  (*message)[kFlagsOffset] |= kFlagZstd;
  std::memcpy(message->data() + kPayloadSizeOffset, &size, sizeof size);
  return size;
}

}  // namespace

uint32_t BitsTableId(const BitsTable& bits) {
  std::vector<uint8_t> bytes;
  bytes.reserve(bits.bits.size() + 1);
  bytes.push_back(static_cast<uint8_t>(bits.layout));
  bytes.insert(bytes.end(), bits.bits.begin(), bits.bits.end());
  return static_cast<uint32_t>(WireChecksum(bytes.data(), bytes.size()));
}

Encoded Encoder::Encode(const float* x, int64_t rows, int64_t cols, const BitsTable& bits,
                        const EncodeOptions& options, float* reconstruction) {
  Encoded result;
  Encode(x, rows, cols, bits, options, &result, reconstruction);
  return result;
}

void Encoder::Encode(const float* x, int64_t rows, int64_t cols, const BitsTable& bits,
                     const EncodeOptions& options, Encoded* result, float* reconstruction) {
  Require(rows >= 0 && cols >= 0, ErrorCode::kInvalidArgument,
          "tensor shape " + ShapeText(rows, cols) + " has a negative dimension");
  Require(rows == 0 || cols <= std::numeric_limits<int64_t>::max() / 8 / rows,
          ErrorCode::kInvalidArgument, "tensor shape " + ShapeText(rows, cols) + " is too large");
  Require(options.scheme <= Scheme::kSymmetric, ErrorCode::kInvalidArgument,
          "unknown scheme " + std::to_string(static_cast<int>(options.scheme)) +
              ": use fp32, bf16, fp16, affine or symmetric");
  const uint64_t elements = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  const bool is_float = IsFloatScheme(options.scheme);
  const GridSpec spec{options.scheme, options.granularity, options.group_size};

  ScaleGrid grid;
  uint64_t raw_payload_size = 0;
  uint32_t table_id = 0;
  bool include_table = false;
  if (is_float) {
    RequireFinite(x, rows, cols);
    raw_payload_size = elements * FloatSchemeWidth(options.scheme);
  } else {
    grid = ComputeGrid(x, rows, cols, spec, bits, options.scale_format);
    raw_payload_size = bits.PackedBytes(rows, cols);
    table_id = BitsTableId(bits);
    include_table = !(last_table_id_ && *last_table_id_ == table_id);
  }

  // Header, table and scales first, into a small buffer; the payload is then written in place
  // behind them in the output, which (reused at the same size) is not zero-filled beforehand.
  std::vector<uint8_t> front;
  ByteWriter w(&front);
  w.Put(kMagic);
  w.Put(kVersion);
  w.Put(static_cast<uint8_t>(options.scheme));
  w.Put(static_cast<uint8_t>(is_float ? Granularity::kTensor : options.granularity));
  w.Put(static_cast<uint8_t>(is_float ? BitsLayout::kUniform : bits.layout));
  w.Put(static_cast<uint8_t>(grid.format));
  w.Put(static_cast<uint8_t>(include_table ? kFlagTableIncluded : 0));  // patched for zstd below
  w.Put(uint16_t{0});
  w.Put(static_cast<uint32_t>(options.granularity == Granularity::kGroup ? options.group_size : 0));
  w.Put(static_cast<uint64_t>(rows));
  w.Put(static_cast<uint64_t>(cols));
  w.Put(table_id);
  w.Put(static_cast<uint32_t>(include_table ? bits.bits.size() : 0));
  w.Put(raw_payload_size);  // patched for zstd below
  if (include_table) w.PutBytes(bits.bits.data(), bits.bits.size());
  if (options.scheme == Scheme::kAffine) {
    for (float z : grid.zeros) PutScale(w, grid.format, z);
  }
  for (float s : grid.steps) PutScale(w, grid.format, s);
  const size_t payload_at = front.size();
  std::vector<uint8_t>& out = result->bytes;
  out.resize(payload_at + raw_payload_size + kChecksumSize);
  std::memcpy(out.data(), front.data(), payload_at);
  uint8_t* payload = out.data() + payload_at;
  if (is_float) {
    WriteFloats(x, elements, options.scheme, payload, reconstruction);
  } else {
    QuantizeAndPack(x, rows, cols, spec, bits, grid, options, payload, reconstruction);
  }

  const uint64_t payload_size = options.zstd ? CompressPayload(&out, payload_at, raw_payload_size, options.zstd_level)
                                             : raw_payload_size;
  out.resize(payload_at + payload_size);
  ByteWriter(&out).Put(WireChecksum(out.data(), out.size()));

  if (!is_float) last_table_id_ = table_id;
  result->count.payload = payload_size;
  result->count.metadata = out.size() - payload_size;
  result->average_bits = is_float ? 8.0 * static_cast<double>(FloatSchemeWidth(options.scheme))
                                  : bits.AverageBits(rows, cols);
}

Decoded Decoder::Decode(const uint8_t* data, size_t size) {
  Decoded d;
  Decode(data, size, &d);
  return d;
}

namespace {

// The fixed 48 bytes at the start of a tensor message (docs/wire-format.md), read and checked.
struct Header {
  Scheme scheme;
  Granularity granularity;
  BitsLayout layout;
  ScaleFormat format;
  uint8_t flags;
  uint32_t group_size;
  uint64_t rows, cols;
  uint32_t table_id;
  uint32_t table_entries;
  uint64_t payload_size;
};

// Checks the length, magic, version and checksum; returns a reader of everything but the checksum.
ByteReader OpenMessage(const uint8_t* data, size_t size) {
  Require(size >= kHeaderSize + kChecksumSize, ErrorCode::kDataLoss,
          "tensor message has " + std::to_string(size) + " bytes, less than the " +
              std::to_string(kHeaderSize + kChecksumSize) + "-byte minimum: it was truncated; resend it");
  ByteReader r(data, size - kChecksumSize);
  r.ExpectFormat(kMagic, kVersion, "tensor message", "AMQT");
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // tests/fuzz: reach the checks behind it
  uint64_t stored_checksum;
  std::memcpy(&stored_checksum, data + size - kChecksumSize, kChecksumSize);
  Require(stored_checksum == WireChecksum(data, size - kChecksumSize), ErrorCode::kDataLoss,
          "tensor message checksum mismatch: it was corrupted in transit; resend it");
#endif
  return r;
}

Header ReadHeader(ByteReader& r, ExpectedShape shape, const DecodeLimits& limits) {
  const auto scheme = r.Get<uint8_t>("scheme");
  const auto granularity = r.Get<uint8_t>("granularity");
  const auto layout = r.Get<uint8_t>("bits_layout");
  const auto format = r.Get<uint8_t>("scale_format");
  Header h{};
  h.flags = r.Get<uint8_t>("flags");
  const auto reserved = r.Get<uint16_t>("reserved");
  h.group_size = r.Get<uint32_t>("group_size");
  h.rows = r.Get<uint64_t>("rows");
  h.cols = r.Get<uint64_t>("cols");
  h.table_id = r.Get<uint32_t>("bits_table_id");
  h.table_entries = r.Get<uint32_t>("bits_table_entries");
  h.payload_size = r.Get<uint64_t>("payload_size");
  Require(scheme <= static_cast<uint8_t>(Scheme::kSymmetric), ErrorCode::kDataLoss,
          "unknown scheme " + std::to_string(scheme) + " in tensor message");
  Require(granularity <= static_cast<uint8_t>(Granularity::kGroup), ErrorCode::kDataLoss,
          "unknown granularity " + std::to_string(granularity) + " in tensor message");
  Require(layout <= static_cast<uint8_t>(BitsLayout::kPerToken), ErrorCode::kDataLoss,
          "unknown bits layout " + std::to_string(layout) + " in tensor message");
  Require(format <= static_cast<uint8_t>(ScaleFormat::kFloat32), ErrorCode::kDataLoss,
          "unknown scale format " + std::to_string(format) + " in tensor message");
  Require((h.flags & ~(kFlagZstd | kFlagTableIncluded)) == 0, ErrorCode::kDataLoss,
          "tensor message sets unknown flags " + std::to_string(h.flags) + ": it comes from a newer amaq; run the same "
          "amaq version on both sides");
  Require(reserved == 0, ErrorCode::kDataLoss,
          "tensor message has reserved field " + std::to_string(reserved) + ", not 0: the message is corrupted");
  h.scheme = static_cast<Scheme>(scheme);
  h.granularity = static_cast<Granularity>(granularity);
  h.layout = static_cast<BitsLayout>(layout);
  h.format = static_cast<ScaleFormat>(format);
  Require((h.granularity == Granularity::kGroup) == (h.group_size != 0), ErrorCode::kDataLoss,
          "tensor message has group_size " + std::to_string(h.group_size) + " with granularity " +
              ToString(h.granularity) + ": group_size is set exactly for the group granularity; the message is corrupted");
  Require((shape.rows < 0 || h.rows == static_cast<uint64_t>(shape.rows)) &&
              (shape.cols < 0 || h.cols == static_cast<uint64_t>(shape.cols)),
          ErrorCode::kInvalidArgument,
          "tensor message is " + ShapeText(static_cast<int64_t>(std::min<uint64_t>(h.rows, INT64_MAX)),
                                           static_cast<int64_t>(std::min<uint64_t>(h.cols, INT64_MAX))) +
              " but its step says " + ShapeText(shape.rows, shape.cols) +
              ": send the activation of the step's batch x tokens and the model's hidden size");
  Require(h.cols == 0 || h.rows <= limits.max_elements / h.cols, ErrorCode::kResourceExhausted,
          "tensor message shape " + std::to_string(h.rows) + " x " + std::to_string(h.cols) + " exceeds the limit of " +
              std::to_string(limits.max_elements) + " elements: send smaller batches or raise the decoder's max_elements");
  Require(h.rows <= limits.max_elements && h.cols <= limits.max_elements, ErrorCode::kResourceExhausted,
          "tensor message dimension exceeds " + std::to_string(limits.max_elements));
  if (IsFloatScheme(h.scheme)) {
    Require(h.granularity == Granularity::kTensor && h.layout == BitsLayout::kUniform &&
                h.format == ScaleFormat::kFloat16 && h.table_id == 0 && h.table_entries == 0 &&
                (h.flags & kFlagTableIncluded) == 0,
            ErrorCode::kDataLoss,
            "a float tensor message must carry granularity, layout, scale format and table id 0 and no bits table");
  }
  return h;
}

// The message's bits table: included, or referenced as `last` (the stream's previous table).
BitsTable ReadBitsTable(ByteReader& r, const Header& h, const std::optional<std::pair<uint32_t, BitsTable>>& last) {
  const int64_t rows = static_cast<int64_t>(h.rows), cols = static_cast<int64_t>(h.cols);
  const int64_t expected = BitsTable::ExpectedEntries(h.layout, rows, cols);
  if ((h.flags & kFlagTableIncluded) == 0) {
    Require(h.table_entries == 0, ErrorCode::kDataLoss, "tensor message counts bits-table entries but says it carries none");
    Require(last && last->first == h.table_id, ErrorCode::kFailedPrecondition,
            "tensor message refers to a bits table this decoder does not hold (the stream "
            "restarted or a message was lost): the sender must reset its encoder and resend");
    Require(last->second.layout == h.layout && static_cast<int64_t>(last->second.bits.size()) == expected,
            ErrorCode::kDataLoss, "the referenced bits table does not fit the tensor's shape");
    return last->second;
  }
  Require(h.table_entries == static_cast<uint64_t>(expected), ErrorCode::kDataLoss,
          "bits table has " + std::to_string(h.table_entries) + " entries but a " + ToString(h.layout) + " table for " +
              ShapeText(rows, cols) + " needs " + std::to_string(expected));
  const uint8_t* entries = r.Take(h.table_entries, "bits_table");
  BitsTable bits{h.layout, std::vector<uint8_t>(entries, entries + h.table_entries)};
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  Require(BitsTableId(bits) == h.table_id, ErrorCode::kDataLoss,
          "bits table does not match its id: the message is corrupted; resend it");
#endif
  return bits;
}

// The zeros (affine) and steps of every scale group, checked.
ScaleGrid ReadScales(ByteReader& r, const Header& h, const GridSpec& spec, const BitsTable& bits) {
  const int64_t groups = ScaleGroupCount(spec, static_cast<int64_t>(h.rows), static_cast<int64_t>(h.cols));
  ScaleGrid grid;
  grid.format = h.format;
  grid.zeros.resize(static_cast<size_t>(groups));
  grid.steps.resize(static_cast<size_t>(groups));
  const size_t scale_bytes = h.format == ScaleFormat::kFloat16 ? 2 : 4;
  const uint64_t scale_count = (h.scheme == Scheme::kAffine ? 2u : 1u) * static_cast<uint64_t>(groups);
  Require(scale_count * scale_bytes <= r.remaining(), ErrorCode::kDataLoss,
          "tensor message ends inside its scales: it was truncated; resend it");
  if (h.scheme == Scheme::kAffine) {
    for (auto& z : grid.zeros) z = GetScale(r, h.format, "zeros");
  }
  for (auto& s : grid.steps) s = GetScale(r, h.format, "steps");
  for (int64_t g = 0; g < groups; ++g) {
    const float step = grid.steps[static_cast<size_t>(g)];
    Require(std::isfinite(step) && step > 0.0f, ErrorCode::kDataLoss,
            "scale group " + std::to_string(g) + " has step " + std::to_string(step) +
                ": steps must be finite and positive; the message is corrupted");
    const int b = ScaleGroupBits(bits, g);
    if (h.scheme == Scheme::kSymmetric) grid.zeros[static_cast<size_t>(g)] = SymmetricZero(step, b);
    const float zero = grid.zeros[static_cast<size_t>(g)];
    Require(GroupDecodesFinite(h.scheme, zero, step, b), ErrorCode::kDataLoss, NonFiniteGroupText(g, zero, step, b));
  }
  return grid;
}

// The payload of `raw_size` bytes once decompressed (into *buffer when it was compressed).
const uint8_t* ReadPayload(ByteReader& r, const Header& h, uint64_t raw_size, std::vector<uint8_t>* buffer) {
  Require(h.payload_size == r.remaining(), ErrorCode::kDataLoss,
          "tensor message says its payload has " + std::to_string(h.payload_size) + " bytes but " +
              std::to_string(r.remaining()) + " follow: it was truncated or corrupted");
  const uint8_t* payload = r.Take(h.payload_size, "payload");
  if ((h.flags & kFlagZstd) == 0) {
    Require(h.payload_size == raw_size, ErrorCode::kDataLoss,
            "payload has " + std::to_string(h.payload_size) + " bytes but " +
                ShapeText(static_cast<int64_t>(h.rows), static_cast<int64_t>(h.cols)) + " needs " +
                std::to_string(raw_size) + ": the message was truncated or corrupted");
    return payload;
  }
  const unsigned long long content = ZSTD_getFrameContentSize(payload, h.payload_size);
  Require(content == raw_size, ErrorCode::kDataLoss,
          "compressed payload declares " + std::to_string(content) + " bytes, the shape needs " +
              std::to_string(raw_size) + ": refusing to decompress it");
  buffer->resize(raw_size);
  const size_t n = ZSTD_decompress(buffer->data(), buffer->size(), payload, h.payload_size);
  Require(!ZSTD_isError(n) && n == raw_size, ErrorCode::kDataLoss,
          std::string("compressed payload is corrupted (") + (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") +
              "): resend it");
  return buffer->data();
}

// The bits after the last code are zero (docs/wire-format.md).
void CheckPadding(const uint8_t* payload, uint64_t size, const BitsTable& bits, int64_t rows, int64_t cols) {
  const uint64_t used = bits.TotalBits(rows, cols) % 8;
  Require(used == 0 || size == 0 || (payload[size - 1] >> used) == 0, ErrorCode::kDataLoss,
          "the payload's final byte has bits set after the last code (they must be zero): the message is corrupted");
}

}  // namespace

void Decoder::Decode(const uint8_t* data, size_t size, Decoded* out, ExpectedShape shape) {
  ByteReader r = OpenMessage(data, size);
  const Header h = ReadHeader(r, shape, limits_);
  Decoded& d = *out;
  d.rows = static_cast<int64_t>(h.rows);
  d.cols = static_cast<int64_t>(h.cols);
  d.scheme = h.scheme;
  d.granularity = h.granularity;
  d.bits = BitsTable{};
  const uint64_t elements = h.rows * h.cols;
  const bool is_float = IsFloatScheme(h.scheme);
  const GridSpec spec{h.scheme, h.granularity, static_cast<int>(h.group_size)};
  ScaleGrid grid;
  if (!is_float) {
    Require(h.granularity != Granularity::kGroup || h.group_size <= (1u << 24), ErrorCode::kDataLoss,
            "group size " + std::to_string(h.group_size) + " in tensor message is out of range");
    d.bits = ReadBitsTable(r, h, last_table_);
    try {
      ValidateGridSpec(spec, d.bits, d.rows, d.cols);
    } catch (const Error& e) {
      throw Error(ErrorCode::kDataLoss, std::string("tensor message is invalid: ") + e.what());
    }
    grid = ReadScales(r, h, spec, d.bits);
  }
  const uint64_t raw_payload_size = is_float ? elements * FloatSchemeWidth(h.scheme) : d.bits.PackedBytes(d.rows, d.cols);
  std::vector<uint8_t> decompressed;
  const uint8_t* payload = ReadPayload(r, h, raw_payload_size, &decompressed);

  d.values.resize(elements);
  if (is_float) {
    ReadFloats(payload, elements, d.scheme, d.values.data());
    RequireFinite(d.values.data(), d.rows, d.cols, /*received=*/true);
  } else {
    CheckPadding(payload, raw_payload_size, d.bits, d.rows, d.cols);
    UnpackAndDequantize(payload, raw_payload_size, d.rows, d.cols, spec, d.bits, grid, d.values.data());
    last_table_ = std::make_pair(h.table_id, d.bits);
  }
  d.count.payload = h.payload_size;
  d.count.metadata = size - h.payload_size;
}

}  // namespace amaq::quant
