// Hand-made AQ-SGD frames (docs/wire-format.md, "AQ-SGD frame") for the tests and the fuzz seeds:
// frames an honest sender never writes, such as a delta on a held entry of another shape.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/aqsgd.h"
#include "quant/byte_io.h"
#include "quant/checksum.h"
#include "quant/codec.h"

namespace amaq::testing {

// A frame whose samples `ids` are all deltas on the entry tagged `base`, each of `rows` x `cols`
// values, taken from x (ids.size() * rows * cols floats) and sent at 4 bits.
inline std::vector<uint8_t> DeltaFrameOn(uint64_t base, const std::vector<uint64_t>& ids, int64_t rows, int64_t cols,
                                         const float* x) {
  using namespace amaq::quant;
  EncodeOptions full, delta;
  full.scheme = Scheme::kBFloat16;
  delta.scheme = Scheme::kSymmetric;
  const int64_t delta_rows = static_cast<int64_t>(ids.size()) * rows;
  const Encoded full_part = Encoder().Encode(x, 0, cols, BitsTable{}, full);
  const Encoded delta_part = Encoder().Encode(x, delta_rows, cols, BitsTable::Uniform(4), delta);
  std::vector<uint8_t> frame;
  ByteWriter w(&frame);
  w.Put(uint32_t{0x47535141});  // "AQSG"
  w.Put(uint8_t{2});
  w.Put(static_cast<uint32_t>(ids.size()));
  w.Put(static_cast<uint64_t>(rows));
  w.Put(static_cast<uint64_t>(cols));
  for (uint64_t id : ids) {
    w.Put(id);
    w.Put(uint8_t{1});
    w.Put(base);
  }
  w.Put(WireChecksum(frame.data(), frame.size()));
  for (const Encoded* part : {&full_part, &delta_part}) {
    w.Put(static_cast<uint64_t>(part->bytes.size()));
    w.PutBytes(part->bytes.data(), part->bytes.size());
  }
  return frame;
}

// The frame the AQ-SGD fuzz target primes its receiver with: samples 1, 2 and 3 in full, 2 x 10
// each. Its tag (the XXH3 of these bytes) is what the seeds' deltas name as their base.
inline std::vector<uint8_t> FuzzPrimeFrame() {
  std::vector<float> x(3 * 2 * 10);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) - 4.5f;
  return amaq::quant::AqsgdSender(amaq::quant::AqsgdOptions{}).Encode(x.data(), {1, 2, 3}, 2, 10).bytes;
}

}  // namespace amaq::testing
