// AQ-SGD (Wang et al., NeurIPS 2022): compress the change of a sample's activation since the last
// time that same sample crossed the cut. Sender and receiver each hold m(id), the last
// reconstructed activation of every sample (ActivationCache). A sample seen for the first time is
// sent in full precision (the warm-up: fp32 or bf16); afterwards only delta = x - m(id) is sent,
// quantized symmetric per channel at `bits`, and both sides set m(id) += deQ(delta). The two
// caches stay bit-identical. Gradients are not delta-coded: they use the plain codec.
//
// Message (docs/wire-format.md, "AQ-SGD frame"): header, sample ids with a full/delta flag each,
// then the full part and the delta part as two codec messages (rows of their samples, in order).
// Each frame is self-contained (its codec parts always carry their one-byte bits tables), so a
// frame can be resent after a reconnect as it is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quant/activation_cache.h"
#include "quant/codec.h"

namespace amaq::quant {

struct AqsgdOptions {
  int bits = 4;                                 // delta bits (2..8)
  Scheme warmup_scheme = Scheme::kBFloat16;     // first visit of a sample: fp32, bf16 or fp16
  uint64_t cache_memory_bytes = uint64_t{1} << 30;
  std::string spill_dir;                        // empty: no spilling (the limit is then hard)
  bool zstd = false;
};

class AqsgdSender {
 public:
  explicit AqsgdSender(AqsgdOptions options);
  // x is [ids.size() * rows_per_sample, cols], sample after sample. `reconstruction`, when not
  // null, receives what the receiver will hold after decoding (rows * cols floats).
  Encoded Encode(const float* x, const std::vector<uint64_t>& ids, int64_t rows_per_sample,
                 int64_t cols, float* reconstruction = nullptr);
  CacheStats cache_stats() const { return cache_.stats(); }

 private:
  AqsgdOptions options_;
  ActivationCache cache_;
};

struct AqsgdDecoded {
  std::vector<uint64_t> ids;
  int64_t rows_per_sample = 0;
  int64_t cols = 0;
  std::vector<float> values;  // [ids.size() * rows_per_sample, cols]
  ByteCount count;
};

class AqsgdReceiver {
 public:
  explicit AqsgdReceiver(AqsgdOptions options, DecodeLimits limits = {});
  // Throws amaq::Error: kDataLoss for malformed frames, kFailedPrecondition when a delta arrives
  // for a sample this receiver holds no entry for (it restarted): the sender must then resend
  // that sample in full. The cache is only changed once the whole frame has been validated,
  // including, when given (>= 0), the shape the caller expects (checked on the frame's header,
  // before anything is decompressed or allocated).
  AqsgdDecoded Decode(const uint8_t* data, size_t size, int64_t expected_rows_per_sample = -1,
                      int64_t expected_cols = -1, int64_t expected_samples = -1);
  CacheStats cache_stats() const { return cache_.stats(); }

 private:
  ActivationCache cache_;
  DecodeLimits limits_;
};

}  // namespace amaq::quant
