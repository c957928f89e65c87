#include "common/model/nf4_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace amaq {
namespace {

constexpr int64_t kGrainElements = int64_t{1} << 15;  // a thread's least share: 32K weights

float BlockScale(const Nf4View& w, int64_t b) {  // as quant::Nf4Weights::BlockScale
  return std::max(0.0f, w.scale_mean + static_cast<float>(w.scale_codes[b]) * w.scale_steps[b / w.scale_block]);
}

// c10::BFloat16's rounding to nearest even without its NaN branch (NF4 values are finite): no
// branch per weight. nf4_rows_avx512.cc keeps its own copy (it shares no code with other files).
uint16_t Bf16Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Per block the 16 levels times its scale (the very products of level x scale), then a code byte
// at a time: its low nibble for the even weight, its high nibble for the odd one.
template <typename Store>
void PortablePass(const Nf4View& w, int64_t first, int64_t count, Store store) {
  const int64_t last = first + count;
  for (int64_t i = first; i < last;) {
    const int64_t b = i / w.block, block_end = std::min(last, (b + 1) * w.block);
    const float scale = BlockScale(w, b);
    float scaled[16];
    for (int l = 0; l < 16; ++l) scaled[l] = w.levels[l] * scale;
    if (i % 2 == 1) {  // a range that begins at an odd weight: the high nibble of its byte
      store(i - first, scaled[w.codes[i / 2] >> 4]);
      ++i;
    }
    for (; i + 1 < block_end; i += 2) {
      const uint8_t byte = w.codes[i / 2];
      store(i - first, scaled[byte & 0xF]);
      store(i + 1 - first, scaled[byte >> 4]);
    }
    if (i < block_end) {  // one that ends before the byte's high nibble
      store(i - first, scaled[w.codes[i / 2] & 0xF]);
      ++i;
    }
  }
}

// Splits [first, first + count) at block boundaries over LibTorch's intra-op threads.
template <typename Out, typename Pass>
void InParallel(const Nf4View& w, int64_t first, int64_t count, Out* out, Pass pass) {
  const int64_t b0 = first / w.block, b1 = (first + count + w.block - 1) / w.block;
  at::parallel_for(b0, b1, std::max<int64_t>(1, kGrainElements / w.block), [&](int64_t begin, int64_t end) {
    const int64_t e0 = std::max(first, begin * w.block), e1 = std::min(first + count, end * w.block);
    pass(w, e0, e1 - e0, out + (e0 - first));
  });
}

}  // namespace

namespace nf4_serial {

void Portable(const Nf4View& w, int64_t first, int64_t count, float* out) {
  PortablePass(w, first, count, [out](int64_t i, float v) { out[i] = v; });
}

void Portable(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16) {
  PortablePass(w, first, count, [out_bf16](int64_t i, float v) { out_bf16[i] = Bf16Bits(v); });
}

}  // namespace nf4_serial

bool Nf4HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

void RebuildNf4RowsPortable(const Nf4View& w, int64_t first, int64_t count, float* out) {
  InParallel(w, first, count, out, [](auto&&... a) { nf4_serial::Portable(a...); });
}
void RebuildNf4RowsPortable(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16) {
  InParallel(w, first, count, out_bf16, [](auto&&... a) { nf4_serial::Portable(a...); });
}
void RebuildNf4RowsAvx512(const Nf4View& w, int64_t first, int64_t count, float* out) {
  InParallel(w, first, count, out, [](auto&&... a) { nf4_serial::Avx512(a...); });
}
void RebuildNf4RowsAvx512(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16) {
  InParallel(w, first, count, out_bf16, [](auto&&... a) { nf4_serial::Avx512(a...); });
}

void RebuildNf4Rows(const Nf4View& w, int64_t first, int64_t count, float* out) {
  Nf4HasAvx512() ? RebuildNf4RowsAvx512(w, first, count, out) : RebuildNf4RowsPortable(w, first, count, out);
}
void RebuildNf4Rows(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16) {
  Nf4HasAvx512() ? RebuildNf4RowsAvx512(w, first, count, out_bf16) : RebuildNf4RowsPortable(w, first, count, out_bf16);
}

}  // namespace amaq
