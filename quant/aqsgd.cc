#include "quant/aqsgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>

#include "common/base/error.h"
#include "quant/byte_io.h"
#include "quant/checksum.h"

namespace amaq::quant {
namespace {

constexpr uint32_t kFrameMagic = 0x47535141;  // "AQSG"
constexpr uint8_t kFrameVersion = 2;
constexpr uint8_t kFull = 0, kDelta = 1;

// Beyond this magnitude a value goes in full rather than as a delta (docs/wire-format.md).
constexpr float kDeltaRange = 1e38f;

void PutPart(ByteWriter& w, const Encoded& part) {
  w.Put(static_cast<uint64_t>(part.bytes.size()));
  w.PutBytes(part.bytes.data(), part.bytes.size());
}

}  // namespace

AqsgdSender::AqsgdSender(AqsgdOptions options)
    : options_(std::move(options)), cache_(options_.cache_memory_bytes, options_.spill_dir, options_.env) {
  Require(options_.bits >= 2 && options_.bits <= kMaxBits, ErrorCode::kInvalidArgument,
          "AQ-SGD delta bits must be 2..8 (symmetric quantization), got " +
              std::to_string(options_.bits));
  Require(IsFloatScheme(options_.warmup_scheme), ErrorCode::kInvalidArgument,
          "AQ-SGD's warm-up scheme must be fp32, bf16 or fp16");
}

AqsgdSender::Split AqsgdSender::SplitSamples(const float* x, const std::vector<uint64_t>& ids,
                                             int64_t rows_per_sample, int64_t cols, bool in_full) {
  const size_t sample_size = static_cast<size_t>(rows_per_sample * cols);
  Split split;
  split.flags.resize(ids.size());
  split.bases.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* xs = x + i * sample_size;
    // A delta adds to an entry of exactly this shape; a sample whose shape changed goes in full,
    // and so does one whose values or entry pass kDeltaRange in magnitude: m + deQ(x - m) then
    // stays within fp32's range on both sides (|x - m| <= 2 kDeltaRange, and the delta's grid
    // covers its channel's largest |x - m| by at most a rounding of its step).
    const std::optional<ActivationCache::Held> held = in_full ? std::nullopt : cache_.Describe(ids[i]);
    split.flags[i] = held && held->rows == rows_per_sample && held->cols == cols ? kDelta : kFull;
    if (split.flags[i] == kDelta) {
      const std::vector<float>& m = *cache_.Find(ids[i]);
      std::vector<float>& delta = split.delta;
      const size_t begin = delta.size();
      delta.resize(begin + sample_size);
      bool within = true;  // one pass: the delta and the range check together
      for (size_t k = 0; k < sample_size; ++k) {
        delta[begin + k] = xs[k] - m[k];
        within &= std::fabs(xs[k]) <= kDeltaRange && std::fabs(m[k]) <= kDeltaRange;
      }
      if (within) {
        split.bases[i] = held->tag;
      } else {
        delta.resize(begin);
        split.flags[i] = kFull;
      }
    }
    if (split.flags[i] == kFull) split.full.insert(split.full.end(), xs, xs + sample_size);
  }
  return split;
}

void AqsgdSender::UpdateCache(const std::vector<uint64_t>& ids, const Split& split,
                              const std::vector<float>& full_hat, const std::vector<float>& delta_hat,
                              int64_t cols, uint64_t tag, float* reconstruction) {
  const size_t sample_size = ids.empty() ? 0 : (split.full.size() + split.delta.size()) / ids.size();
  size_t full_at = 0, delta_at = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> m;
    if (split.flags[i] == kFull) {
      m.assign(full_hat.begin() + full_at, full_hat.begin() + full_at + sample_size);
      full_at += sample_size;
    } else {
      m = *cache_.Find(ids[i]);
      for (size_t k = 0; k < sample_size; ++k) m[k] += delta_hat[delta_at + k];
      delta_at += sample_size;
    }
    if (reconstruction) std::copy(m.begin(), m.end(), reconstruction + i * sample_size);
    cache_.Insert(ids[i], std::move(m), cols, tag);
  }
}

Encoded AqsgdSender::Encode(const float* x, const std::vector<uint64_t>& ids,
                            int64_t rows_per_sample, int64_t cols, float* reconstruction, bool in_full) {
  Require(rows_per_sample > 0 && cols > 0, ErrorCode::kInvalidArgument,
          "AQ-SGD needs rows_per_sample > 0 and cols > 0");
  Require(std::unordered_set<uint64_t>(ids.begin(), ids.end()).size() == ids.size(),
          ErrorCode::kInvalidArgument,
          "AQ-SGD batch repeats a sample id: each sample may appear once per message");
  const Split split = SplitSamples(x, ids, rows_per_sample, cols, in_full);
  const auto rows_of = [&](const std::vector<float>& part) {
    return static_cast<int64_t>(part.size()) / cols;
  };
  EncodeOptions full_options, delta_options;
  full_options.scheme = options_.warmup_scheme;
  full_options.zstd = delta_options.zstd = options_.zstd;
  delta_options.scheme = Scheme::kSymmetric;
  delta_options.granularity = Granularity::kChannel;
  std::vector<float> full_hat(split.full.size()), delta_hat(split.delta.size());
  const Encoded full_part = Encoder().Encode(split.full.data(), rows_of(split.full), cols, BitsTable{},
                                             full_options, full_hat.data());
  const Encoded delta_part = Encoder().Encode(split.delta.data(), rows_of(split.delta), cols,
                                              BitsTable::Uniform(options_.bits), delta_options, delta_hat.data());

  Encoded frame;
  ByteWriter w(&frame.bytes);
  w.Put(kFrameMagic);
  w.Put(kFrameVersion);
  w.Put(static_cast<uint32_t>(ids.size()));
  w.Put(static_cast<uint64_t>(rows_per_sample));
  w.Put(static_cast<uint64_t>(cols));
  for (size_t i = 0; i < ids.size(); ++i) {
    w.Put(ids[i]);
    w.Put(split.flags[i]);
    w.Put(split.bases[i]);
  }
  w.Put(WireChecksum(frame.bytes.data(), frame.bytes.size()));
  const uint64_t frame_header = frame.bytes.size() + 16;  // + the two part lengths
  PutPart(w, full_part);
  PutPart(w, delta_part);
  frame.count.payload = full_part.count.payload + delta_part.count.payload;
  frame.count.metadata = frame_header + full_part.count.metadata + delta_part.count.metadata;

  // Update m(id) exactly as the receiver will, tagged with this frame, and hand back what it will hold.
  UpdateCache(ids, split, full_hat, delta_hat, cols, WireChecksum(frame.bytes.data(), frame.bytes.size()),
              reconstruction);
  const double elements = static_cast<double>(split.full.size() + split.delta.size());
  frame.average_bits = elements == 0 ? 0
      : (full_part.average_bits * static_cast<double>(split.full.size()) +
         options_.bits * static_cast<double>(split.delta.size())) / elements;
  return frame;
}

AqsgdReceiver::AqsgdReceiver(AqsgdOptions options, DecodeLimits limits)
    : cache_(options.cache_memory_bytes, options.spill_dir, options.env), limits_(limits) {}

namespace {

// What an AQ-SGD frame's header says (docs/wire-format.md, "AQ-SGD frame"), checked.
struct FrameHeader {
  uint32_t samples = 0;
  uint64_t rows_per_sample = 0, cols = 0;
  std::vector<uint64_t> ids, bases;
  std::vector<uint8_t> flags;
};

// The frame's shape against the decoder's limit and what the caller expects (-1: any).
void CheckFrameShape(const FrameHeader& h, const DecodeLimits& limits, int64_t expected_rows_per_sample,
                     int64_t expected_cols, int64_t expected_samples) {
  Require(h.rows_per_sample > 0 && h.cols > 0, ErrorCode::kDataLoss,
          "AQ-SGD frame has samples of " + std::to_string(h.rows_per_sample) + " rows and " + std::to_string(h.cols) +
              " columns: both must be positive; the message is corrupted");
  Require(h.rows_per_sample <= limits.max_elements &&
              h.cols <= limits.max_elements / h.rows_per_sample &&
              h.samples <= limits.max_elements / (h.rows_per_sample * h.cols),
          ErrorCode::kResourceExhausted,
          "AQ-SGD frame shape exceeds the decoder's limit of " +
              std::to_string(limits.max_elements) + " elements");
  Require((expected_rows_per_sample < 0 || h.rows_per_sample == static_cast<uint64_t>(expected_rows_per_sample)) &&
              (expected_cols < 0 || h.cols == static_cast<uint64_t>(expected_cols)) &&
              (expected_samples < 0 || h.samples == static_cast<uint64_t>(expected_samples)),
          ErrorCode::kInvalidArgument,
          "AQ-SGD frame has " + std::to_string(h.samples) + " samples of " + std::to_string(h.rows_per_sample) +
              " rows and " + std::to_string(h.cols) + " columns, not the expected " + std::to_string(expected_samples) +
              " of " + std::to_string(expected_rows_per_sample) + " and " + std::to_string(expected_cols) +
              " (-1: any): send the step's own batch");
}

// Reads the header of the frame `data` up to its checksum, which it checks.
FrameHeader ReadFrameHeader(ByteReader& r, const uint8_t* data, const DecodeLimits& limits,
                            int64_t expected_rows_per_sample, int64_t expected_cols, int64_t expected_samples) {
  r.ExpectFormat(kFrameMagic, kFrameVersion, "AQ-SGD frame", "AQSG");
  FrameHeader h;
  h.samples = r.Get<uint32_t>("samples");
  h.rows_per_sample = r.Get<uint64_t>("rows_per_sample");
  h.cols = r.Get<uint64_t>("cols");
  CheckFrameShape(h, limits, expected_rows_per_sample, expected_cols, expected_samples);
  Require(uint64_t{h.samples} * 17 <= r.remaining(), ErrorCode::kDataLoss,
          "AQ-SGD frame ends inside its sample list: it was truncated; resend it");
  h.flags.resize(h.samples);
  h.bases.resize(h.samples);
  h.ids.resize(h.samples);
  for (uint32_t i = 0; i < h.samples; ++i) {
    h.ids[i] = r.Get<uint64_t>("sample_id");
    h.flags[i] = r.Get<uint8_t>("sample_flag");
    h.bases[i] = r.Get<uint64_t>("sample_base");
    Require(h.flags[i] == kFull || h.flags[i] == kDelta, ErrorCode::kDataLoss,
            "AQ-SGD sample flag must be 0 (full) or 1 (delta)");
    Require(h.flags[i] == kDelta || h.bases[i] == 0, ErrorCode::kDataLoss, "AQ-SGD full sample with a base tag");
  }
  const size_t header_end = r.position();
  const auto header_checksum = r.Get<uint64_t>("header_checksum");
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // tests/fuzz: reach the checks behind it
  Require(header_checksum == WireChecksum(data, header_end), ErrorCode::kDataLoss,
          "AQ-SGD frame header checksum mismatch: it was corrupted in transit; resend it");
#else
  (void)header_checksum;
  (void)data;
#endif
  Require(std::unordered_set<uint64_t>(h.ids.begin(), h.ids.end()).size() == h.ids.size(),
          ErrorCode::kDataLoss, "AQ-SGD frame repeats a sample id");
  return h;
}

// One part of a frame, which must have exactly the rows its samples declare (checked before it is
// decompressed). Whatever a part breaks is a malformed frame (kDataLoss), whichever code the
// tensor message alone would get: other rows or columns, a referenced bits table, non-finite values.
Decoded DecodeFramePart(const DecodeLimits& limits, const uint8_t* bytes, uint64_t part_size, size_t part_samples,
                        const FrameHeader& h, const char* name) {
  Decoded part;
  try {
    Decoder(limits).Decode(bytes, part_size, &part,
                           ExpectedShape{static_cast<int64_t>(part_samples * h.rows_per_sample), static_cast<int64_t>(h.cols)});
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kDataLoss) throw;
    throw Error(ErrorCode::kDataLoss,
                std::string("AQ-SGD frame's ") + name + " part is invalid (" + e.what() + "): the message is corrupted");
  }
  return part;
}

// Which samples keep the entry this frame (tagged `tag`) set already: a frame decoded again. An
// entry that holds this frame's tag in another shape is not this frame's (a cache file altered by
// hand): a full sample replaces it, a delta is refused. A delta must add to the entry it was
// computed against, of exactly the frame's shape.
std::vector<bool> CheckDeltaBases(const ActivationCache& cache, const FrameHeader& h, uint64_t tag) {
  std::vector<bool> taken(h.samples);
  for (uint32_t i = 0; i < h.samples; ++i) {
    const std::optional<ActivationCache::Held> held = cache.Describe(h.ids[i]);
    const bool same_shape = held && held->rows == static_cast<int64_t>(h.rows_per_sample) &&
                            held->cols == static_cast<int64_t>(h.cols);
    taken[i] = same_shape && held->tag == tag;
    if (taken[i] || h.flags[i] == kFull) continue;
    const std::string sample = "AQ-SGD delta for sample " + std::to_string(h.ids[i]);
    Require(held && held->tag == h.bases[i], ErrorCode::kFailedPrecondition,
            sample + (held ? " builds on another entry than this receiver's" : " but this receiver holds no entry for it") +
                " (a restart from an older checkpoint, or a lost frame): the sender must send the step's samples in full");
    Require(same_shape, ErrorCode::kFailedPrecondition,
            sample + " is " + std::to_string(h.rows_per_sample) + " x " + std::to_string(h.cols) +
                " but the entry it adds to is " + std::to_string(held->rows) + " x " + std::to_string(held->cols) +
                " (the sample's shape changed): the sender must send it in full");
  }
  return taken;
}

}  // namespace

AqsgdDecoded AqsgdReceiver::Decode(const uint8_t* data, size_t size, int64_t expected_rows_per_sample,
                                   int64_t expected_cols, int64_t expected_samples) {
  ByteReader r(data, size);
  FrameHeader h = ReadFrameHeader(r, data, limits_, expected_rows_per_sample, expected_cols, expected_samples);
  const auto full_size = r.Get<uint64_t>("full_part_size");
  const uint8_t* full_bytes = r.Take(full_size, "full_part");
  const auto delta_size = r.Get<uint64_t>("delta_part_size");
  const uint8_t* delta_bytes = r.Take(delta_size, "delta_part");
  Require(r.remaining() == 0, ErrorCode::kDataLoss, "AQ-SGD frame has trailing bytes");
  size_t full_samples = 0;
  for (uint8_t f : h.flags) full_samples += f == kFull;
  const Decoded full = DecodeFramePart(limits_, full_bytes, full_size, full_samples, h, "full");
  const Decoded delta = DecodeFramePart(limits_, delta_bytes, delta_size, h.samples - full_samples, h, "delta");
  Require(IsFloatScheme(full.scheme) && delta.scheme == Scheme::kSymmetric && delta.granularity == Granularity::kChannel &&
              delta.bits.layout == BitsLayout::kUniform,
          ErrorCode::kDataLoss,
          "an AQ-SGD frame's full part must be a float message and its delta part symmetric per channel with one "
          "width: the message is corrupted");
  const uint64_t tag = WireChecksum(data, size);
  const std::vector<bool> taken = CheckDeltaBases(cache_, h, tag);

  AqsgdDecoded out;
  out.ids = std::move(h.ids);
  out.rows_per_sample = static_cast<int64_t>(h.rows_per_sample);
  out.cols = static_cast<int64_t>(h.cols);
  const size_t sample_size = h.rows_per_sample * h.cols;
  out.values.resize(h.samples * sample_size);
  size_t full_at = 0, delta_at = 0;
  for (uint32_t i = 0; i < h.samples; ++i) {
    float* value = out.values.data() + i * sample_size;
    if (taken[i]) {
      const std::vector<float>& m = *cache_.Find(out.ids[i]);
      std::copy(m.begin(), m.end(), value);
    } else if (h.flags[i] == kFull) {
      std::copy(full.values.begin() + full_at, full.values.begin() + full_at + sample_size, value);
    } else {
      const std::vector<float>& m = *cache_.Find(out.ids[i]);
      for (size_t k = 0; k < sample_size; ++k) value[k] = m[k] + delta.values[delta_at + k];
      Require(std::all_of(value, value + sample_size, [](float v) { return std::isfinite(v); }), ErrorCode::kDataLoss,
              "AQ-SGD delta for sample " + std::to_string(out.ids[i]) +
                  " takes its entry beyond fp32's range (a sender sends such samples in full): the message is corrupted");
    }
    (h.flags[i] == kFull ? full_at : delta_at) += sample_size;
  }
  // The frame is valid: its samples set their entries.
  for (uint32_t i = 0; i < h.samples; ++i) {
    if (taken[i]) continue;
    const auto begin = out.values.begin() + static_cast<long>(i * sample_size);
    cache_.Insert(out.ids[i], std::vector<float>(begin, begin + static_cast<long>(sample_size)), out.cols, tag);
  }
  out.count.payload = full.count.payload + delta.count.payload;
  out.count.metadata = size - out.count.payload;
  return out;
}

}  // namespace amaq::quant
