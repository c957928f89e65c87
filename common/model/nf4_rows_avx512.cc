// The AVX-512F pass of nf4_rows.h, compiled with -mavx512f: it includes nothing with inline
// functions shared with other files (no LibTorch, no standard containers), so that no AVX-512
// copy of a shared inline function can be the one the linker keeps. Whole blocks of a multiple
// of 32 weights go 32 at a time: 16 code bytes widened to 32-bit lanes, each byte's two nibbles
// spread over two lanes, the levels looked up by one permute of a register holding all 16, times
// the block's scale; bf16 is rounded to nearest even in integer lanes as c10::BFloat16 rounds.
// Partial blocks at either end, and blocks of other sizes, go one weight at a time.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common/model/nf4_rows.h"

namespace amaq::nf4_serial {
namespace {

float BlockScale(const Nf4View& w, int64_t b) {  // as quant::Nf4Weights::BlockScale
  const float scale = w.scale_mean + static_cast<float>(w.scale_codes[b]) * w.scale_steps[b / w.scale_block];
  return scale > 0.0f ? scale : 0.0f;
}

uint16_t Bf16Bits(float v) {  // as nf4_rows.cc's: c10::BFloat16's rounding; NF4 values are never NaN
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void Store(float* out, __m512 v) { _mm512_storeu_ps(out, v); }
void Store(uint16_t* out, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(rounded));
}
void Store(float* out, float v) { *out = v; }
void Store(uint16_t* out, float v) { *out = Bf16Bits(v); }

// 32 weights from 16 code bytes: element 2j is byte j's low nibble, 2j + 1 its high one.
template <typename Out>
void Rebuild32(const uint8_t* bytes, __m512 levels, __m512 scale, Out* out) {
  const __m512i pairs_low = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i pairs_high = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m512i shifts = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
  const __m512i nibble = _mm512_set1_epi32(0xF);
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  for (int half = 0; half < 2; ++half) {
    const __m512i spread = _mm512_permutexvar_epi32(half == 0 ? pairs_low : pairs_high, b);
    const __m512i codes = _mm512_and_si512(_mm512_srlv_epi32(spread, shifts), nibble);
    Store(out + 16 * half, _mm512_mul_ps(_mm512_permutexvar_ps(codes, levels), scale));
  }
}

template <typename Out>
void Pass(const Nf4View& w, int64_t first, int64_t count, Out* out) {
  const __m512 levels = _mm512_loadu_ps(w.levels);
  const int64_t last = first + count;
  for (int64_t i = first; i < last;) {
    const int64_t b = i / w.block, block_begin = b * w.block, block_end = block_begin + w.block;
    const float scale = BlockScale(w, b);
    if (w.block % 32 == 0 && i == block_begin && block_end <= last) {
      const __m512 scales = _mm512_set1_ps(scale);
      for (; i < block_end; i += 32) Rebuild32(w.codes + i / 2, levels, scales, out + (i - first));
      continue;
    }
    for (const int64_t end = block_end < last ? block_end : last; i < end; ++i) {
      Store(out + (i - first), w.levels[(w.codes[i / 2] >> (4 * (i % 2))) & 0xF] * scale);
    }
  }
}

}  // namespace

void Avx512(const Nf4View& w, int64_t first, int64_t count, float* out) { Pass(w, first, count, out); }
void Avx512(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16) { Pass(w, first, count, out_bf16); }

}  // namespace amaq::nf4_serial
