// AQ-SGD (Wang et al., NeurIPS 2022): compress the change of a sample's activation since the last
// time that same sample crossed the cut. Sender and receiver each hold m(id), the last
// reconstructed activation of every sample (ActivationCache). A sample seen for the first time is
// sent in full precision (the warm-up: fp32 or bf16); afterwards only delta = x - m(id) is sent,
// quantized symmetric per channel at `bits`, and both sides set m(id) += deQ(delta). Gradients
// are not delta-coded: they use the plain codec.
//
// Each entry is tagged with the frame that set it (the XXH3-64 of the frame's bytes), and each delta
// names the tag it adds to, so the two caches need not be kept in step: either side may restart
// from a saved cache of any age, or miss a frame. A receiver refuses a delta whose base it does not
// hold, the sender then sends that step's samples in full, and an entry agrees on both sides
// whenever its tags do. A frame decoded again leaves the entries it set as they are.
//
// Message (docs/wire-format.md, "AQ-SGD frame"): header, sample ids with a full/delta flag and a
// base tag each, then the full part and the delta part as two codec messages (rows of their
// samples, in order). Each frame is self-contained (its codec parts always carry their one-byte
// bits tables), so a frame can be resent after a reconnect as it is.
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
  Env* env = Env::Default();                    // the cache's files (not owned)
  bool zstd = false;
};

class AqsgdSender {
 public:
  explicit AqsgdSender(AqsgdOptions options);
  // x is [ids.size() * rows_per_sample, cols], sample after sample. `reconstruction`, when not
  // null, receives what the receiver will hold after decoding (rows * cols floats). `in_full`
  // sends every sample in full, whatever the cache holds (after the receiver refused a delta); a
  // sample whose cached entry has another shape goes in full too, and so does one whose values or
  // entry pass 1e38 in magnitude (its delta could take the entry beyond fp32). Throws amaq::Error
  // (kInvalidArgument) for a repeated id, an empty shape, non-finite values, or values its
  // warm-up scheme cannot hold; the cache is then unchanged.
  Encoded Encode(const float* x, const std::vector<uint64_t>& ids, int64_t rows_per_sample,
                 int64_t cols, float* reconstruction = nullptr, bool in_full = false);
  CacheStats cache_stats() const { return cache_.stats(); }
  ActivationCache& cache() { return cache_; }  // to save and load it (ActivationCache::Save)

 private:
  // The message's samples split into those sent in full and those sent as deltas to their entry.
  struct Split {
    std::vector<uint8_t> flags;  // per sample: in full or as a delta
    std::vector<uint64_t> bases;  // per sample sent as a delta: the tag of the entry it adds to
    std::vector<float> full, delta;  // the samples sent in full; the deltas, sample after sample
  };
  Split SplitSamples(const float* x, const std::vector<uint64_t>& ids, int64_t rows_per_sample,
                     int64_t cols, bool in_full);
  // Sets each sample's entry to what the receiver will hold after decoding `split`, tagged `tag`.
  void UpdateCache(const std::vector<uint64_t>& ids, const Split& split, const std::vector<float>& full_hat,
                   const std::vector<float>& delta_hat, int64_t cols, uint64_t tag, float* reconstruction);

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
  // Throws amaq::Error (docs/wire-format.md, "AQ-SGD frame", lists each case): kDataLoss for
  // malformed frames (parts of another shape than their samples' included, any error inside a
  // part, a delta that takes its entry beyond fp32), kResourceExhausted
  // over the element limit, kInvalidArgument when the frame's shape is not the one the caller
  // expects (when given, >= 0; checked on the frame's header, before anything is decompressed or
  // allocated), kFailedPrecondition when a delta adds to an entry this receiver does not hold
  // (none, another tag, or another shape): the sender must then send the step's samples in full.
  // The cache is only changed once the whole frame has been validated.
  AqsgdDecoded Decode(const uint8_t* data, size_t size, int64_t expected_rows_per_sample = -1,
                      int64_t expected_cols = -1, int64_t expected_samples = -1);
  CacheStats cache_stats() const { return cache_.stats(); }
  ActivationCache& cache() { return cache_; }

 private:
  ActivationCache cache_;
  DecodeLimits limits_;
};

}  // namespace amaq::quant
