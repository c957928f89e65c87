#include "quant/kernels_avx512.h"

#if defined(__x86_64__)

// GCC 12's avx512fintrin.h seeds masked intrinsics with _mm512_undefined_*(), which it then
// reports as uninitialised (GCC bug 105593): silence that here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <limits>

#define AMAQ_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))

namespace amaq::quant::avx512 {
namespace {

// Software prefetch distance in floats (measured on a 2-vCPU EPYC: without it these loops wait
// on DRAM at well under its bandwidth). The range pass and per-channel quantization prefetch
// into the L2 cache only (the L1 cache holds their running extremes or scales).
constexpr int64_t kPrefetchAhead = 1024;

AMAQ_AVX512 inline __mmask16 FirstLanes(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// The portable loop's codes, round_half_even(clamp((x - zero) * inv_step, 0, max_code)), with the
// lower clamp moved after the rounding: the result is negative where the code is 0, and the
// caller's saturating packs (or a max with 0) finish it. That is the same code for every u:
// min_ps(m, u) is `m < u ? m : u`, so a NaN u stays NaN and, like every u below -2^31 or below
// 0.5, converts to a value that saturates to 0 (the portable clamp maps NaN to 0 too).
AMAQ_AVX512 inline __m512i Codes16(__m512 x, __m512 zero, __m512 inv_step, __m512 max_code) {
  const __m512 u = _mm512_min_ps(max_code, _mm512_mul_ps(_mm512_sub_ps(x, zero), inv_step));
  return _mm512_cvt_roundps_epi32(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

AMAQ_AVX512 inline __m512 Dequantize16(__m128i codes, __m512 zero, __m512 step) {
  const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes));
  return _mm512_add_ps(zero, _mm512_mul_ps(c, step));
}

// Where the scales of elements i..i+15 come from: one per channel (loaded), or one for the run
// (broadcast). `step` is the step or its reciprocal, as the loop needs.
struct ChannelScales {
  const float* zero;
  const float* step;
  const float* max_code;
  AMAQ_AVX512 __m512 Zero(int64_t i, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, zero + i); }
  AMAQ_AVX512 __m512 Step(int64_t i, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, step + i); }
  AMAQ_AVX512 __m512 MaxCode(int64_t i, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, max_code + i); }
};

struct RunScales {
  float zero, step, max_code;
  AMAQ_AVX512 __m512 Zero(int64_t, __mmask16) const { return _mm512_set1_ps(zero); }
  AMAQ_AVX512 __m512 Step(int64_t, __mmask16) const { return _mm512_set1_ps(step); }
  AMAQ_AVX512 __m512 MaxCode(int64_t, __mmask16) const { return _mm512_set1_ps(max_code); }
};

constexpr __mmask16 kAllLanes = 0xFFFF;

template <typename Scales>
AMAQ_AVX512 inline __m512i CodesAt(const float* x, const Scales& s, int64_t i, __mmask16 m = kAllLanes) {
  return Codes16(_mm512_maskz_loadu_ps(m, x + i), s.Zero(i, m), s.Step(i, m), s.MaxCode(i, m));
}

// Rows of n codes under the same scales: each block of 64 columns loads its scales once for all
// rows (per-channel scales otherwise take most of the traffic from the L2 cache).
template <typename Scales>
AMAQ_AVX512 void Quantize(const float* x, int64_t rows, int64_t n, const Scales& s, uint8_t* codes) {
  // 64 codes per round: two saturating packs narrow four vectors of 32-bit codes to bytes
  // (interleaved by 128-bit lane), one permutation puts them back in order.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 zero[4], inv_step[4], max_code[4];
    for (int k = 0; k < 4; ++k) {
      zero[k] = s.Zero(i + 16 * k, kAllLanes);
      inv_step[k] = s.Step(i + 16 * k, kAllLanes);
      max_code[k] = s.MaxCode(i + 16 * k, kAllLanes);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * n + i;
      __m512i c[4];
      for (int k = 0; k < 4; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(xr + 16 * k + rows * n), _MM_HINT_T1);
        c[k] = Codes16(_mm512_loadu_ps(xr + 16 * k), zero[k], inv_step[k], max_code[k]);
      }
      const __m512i q01 = _mm512_packus_epi32(c[0], c[1]);
      const __m512i q23 = _mm512_packus_epi32(c[2], c[3]);
      _mm512_storeu_si512(codes + r * n + i, _mm512_permutexvar_epi32(order, _mm512_packus_epi16(q01, q23)));
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? kAllLanes : FirstLanes(n - i);
    for (int64_t r = 0; r < rows; ++r) {
      _mm512_mask_cvtepi32_storeu_epi8(codes + r * n + i, m,
                                       _mm512_max_epi32(CodesAt(x + r * n, s, i, m), _mm512_setzero_si512()));
    }
  }
}

template <typename Scales>
AMAQ_AVX512 inline __m512 ValuesAt(const uint8_t* codes, const Scales& s, int64_t i, __mmask16 m = kAllLanes) {
  return Dequantize16(_mm_maskz_loadu_epi8(m, codes + i), s.Zero(i, m), s.Step(i, m));
}

template <typename Scales>
AMAQ_AVX512 void Dequantize(const uint8_t* codes, int64_t n, const Scales& s, float* out,
                            bool bypass_cache) {
  int64_t i = 0;
  if (bypass_cache) {  // non-temporal stores need 64-byte alignment: the head goes first
    const auto misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out) % 64) / 4;
    if (misaligned != 0) {
      i = std::min(n, 16 - misaligned);
      _mm512_mask_storeu_ps(out, FirstLanes(i), ValuesAt(codes, s, 0, FirstLanes(i)));
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 v = ValuesAt(codes, s, i);
    if (bypass_cache) {
      _mm512_stream_ps(out + i, v);
    } else {
      _mm512_storeu_ps(out + i, v);
    }
  }
  if (i < n) _mm512_mask_storeu_ps(out + i, FirstLanes(n - i), ValuesAt(codes, s, i, FirstLanes(n - i)));
  if (bypass_cache) _mm_sfence();
}

}  // namespace

AMAQ_AVX512 void QuantizeRowsPerChannel(const float* x, int64_t rows, int64_t n, const float* zeros,
                                        const float* inv_steps, const float* max_codes,
                                        uint8_t* codes) {
  Quantize(x, rows, n, ChannelScales{zeros, inv_steps, max_codes}, codes);
}

AMAQ_AVX512 void DequantizeRowPerChannel(const uint8_t* codes, int64_t n, const float* zeros,
                                         const float* steps, float* out, bool bypass_cache) {
  Dequantize(codes, n, ChannelScales{zeros, steps, nullptr}, out, bypass_cache);
}

AMAQ_AVX512 void QuantizeRun(const float* x, int64_t n, float zero, float inv_step, float max_code,
                             uint8_t* codes) {
  Quantize(x, 1, n, RunScales{zero, inv_step, max_code}, codes);
}

AMAQ_AVX512 void DequantizeRun(const uint8_t* codes, int64_t n, float zero, float step, float* out) {
  Dequantize(codes, n, RunScales{zero, step, 0.0f}, out, false);
}

// Sixteen partial minima and maxima, reduced in lane order as the portable loop does (so a zero
// extreme keeps the same sign); NaN by an unordered compare, infinities show in lo or hi.
AMAQ_AVX512 void RangeOfRun(const float* x, int64_t n, float* lo, float* hi, float* bad) {
  __m512 l = _mm512_set1_ps(x[0]), h = l;
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + kPrefetchAhead), _MM_HINT_T0);
    const __m512 v = _mm512_loadu_ps(x + i);
    l = _mm512_min_ps(v, l);
    h = _mm512_max_ps(v, h);
    nan = static_cast<__mmask16>(nan | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
  }
  float part_lo[16], part_hi[16];
  _mm512_storeu_ps(part_lo, l);
  _mm512_storeu_ps(part_hi, h);
  float lo_all = part_lo[0], hi_all = part_hi[0];
  for (int j = 0; j < 16; ++j) {
    lo_all = std::min(lo_all, part_lo[j]);
    hi_all = std::max(hi_all, part_hi[j]);
  }
  bool finite = nan == 0;
  for (; i < n; ++i) {
    lo_all = std::min(lo_all, x[i]);
    hi_all = std::max(hi_all, x[i]);
    finite = finite && std::isfinite(x[i]);
  }
  *lo = lo_all;
  *hi = hi_all;
  if (!(finite && std::isfinite(lo_all) && std::isfinite(hi_all))) *bad += std::numeric_limits<float>::quiet_NaN();
}

// Rows are taken eight at a time, so lo and hi are loaded and stored once per eight rows; each
// column still sees its rows in order (which matters only for the sign of a zero extreme). NaN is
// looked for with an unordered compare into a mask (no floating-point chain across the loop), and
// an infinity shows in lo or hi.
AMAQ_AVX512 void RangeOfColumns(const float* x, int64_t rows, int64_t cols, float* lo, float* hi,
                                float* bad) {
  std::copy(x, x + cols, lo);
  std::copy(x, x + cols, hi);
  __mmask16 nan = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int64_t r_end = std::min(rows, r0 + 8);
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = cols - c >= 16 ? kAllLanes : FirstLanes(cols - c);
      __m512 l = _mm512_maskz_loadu_ps(m, lo + c);
      __m512 h = _mm512_maskz_loadu_ps(m, hi + c);
      for (int64_t r = r0; r < r_end; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(x + r * cols + c + kPrefetchAhead), _MM_HINT_T1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + r * cols + c);
        l = _mm512_min_ps(v, l);
        h = _mm512_max_ps(v, h);
        nan = static_cast<__mmask16>(nan | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
      }
      _mm512_mask_storeu_ps(lo + c, m, l);
      _mm512_mask_storeu_ps(hi + c, m, h);
    }
  }
  bool finite = nan == 0;
  for (int64_t c = 0; c < cols; ++c) finite = finite && std::isfinite(lo[c]) && std::isfinite(hi[c]);
  if (!finite) *bad += std::numeric_limits<float>::quiet_NaN();
}

namespace {

// Three rounds of joining neighbours: pairs of codes into 16-bit lanes, pairs of pairs into
// 32-bit lanes, pairs of quads into the group's 64-bit word; each round shifts the upper half by
// the width of the lower half.
AMAQ_AVX512 inline __m512i JoinBlock(const uint8_t* codes, const uint16_t* pair_shift,
                                     const uint32_t* quad_shift, const uint64_t* group_shift) {
  const __m512i v = _mm512_loadu_si512(codes);
  const __m512i pairs = _mm512_or_si512(
      _mm512_and_si512(v, _mm512_set1_epi16(0xFF)),
      _mm512_sllv_epi16(_mm512_srli_epi16(v, 8), _mm512_loadu_si512(pair_shift)));
  const __m512i quads = _mm512_or_si512(
      _mm512_and_si512(pairs, _mm512_set1_epi32(0xFFFF)),
      _mm512_sllv_epi32(_mm512_srli_epi32(pairs, 16), _mm512_loadu_si512(quad_shift)));
  return _mm512_or_si512(
      _mm512_and_si512(quads, _mm512_set1_epi64(0xFFFFFFFF)),
      _mm512_sllv_epi64(_mm512_srli_epi64(quads, 32), _mm512_loadu_si512(group_shift)));
}

// One round of a segmented OR: lane k takes in lane k - d's bits where `same` says both go to
// the same word.
template <int d>
AMAQ_AVX512 inline __m512i MergeWithEarlier(__mmask8 same, __m512i bits) {
  return _mm512_mask_or_epi64(bits, same, bits, _mm512_alignr_epi64(bits, _mm512_setzero_si512(), 8 - d));
}

}  // namespace

// Each block's eight group words go to their bits in the stream at once: group k starts at bit
// t_k = fill + group_bit[k] from `word`, so in word q_k = t_k / 64 at shift t_k % 64 (its bits
// beyond that word spill into q_k + 1). q_k rises by at most one from group to group (a group has
// at most 64 bits), so the groups of one word are neighbours: a segmented OR (three rounds of
// neighbour merges) gathers each word's bits in its last group's lane, and a compression lays the
// words out in order. The word the previous block ended in, and its spill, join the first lane.
AMAQ_AVX512 BitCursor DepositBlocks(const uint8_t* codes, int64_t blocks, const uint16_t* pair_shift,
                                    const uint32_t* quad_shift, const uint64_t* group_shift,
                                    const uint64_t* group_bit, uint64_t end_bit, uint8_t* word,
                                    size_t size, int fill_bits, uint64_t bits) {
  const __m512i none = _mm512_set1_epi64(-1);  // a word index no group has
  const __m512i fill = _mm512_set1_epi64(fill_bits);
  uint64_t last_q = 0, last = bits, spill = 0;  // the last word written, its bits, the next one's
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512i groups = JoinBlock(codes + 64 * b, pair_shift + 32 * b, quad_shift + 16 * b,
                                     group_shift + 8 * b);
    const __m512i t = _mm512_add_epi64(fill, _mm512_loadu_si512(group_bit + 8 * b));
    const __m512i q = _mm512_srli_epi64(t, 6);
    const __m512i shift = _mm512_and_si512(t, _mm512_set1_epi64(63));
    __m512i low = _mm512_sllv_epi64(groups, shift);
    const __m512i high = _mm512_srlv_epi64(groups, _mm512_sub_epi64(_mm512_set1_epi64(64), shift));
    // same1: lane k's word is lane k-1's; a word's groups are neighbours, so lane k shares its
    // word with lane k-2 when it does with k-1 and k-1 does with k-2, and so on.
    const unsigned same1 = _mm512_cmpeq_epi64_mask(q, _mm512_alignr_epi64(q, none, 7));
    const unsigned same2 = same1 & (same1 << 1);
    const unsigned same4 = same2 & (same2 << 2);
    low = MergeWithEarlier<1>(static_cast<__mmask8>(same1), low);
    low = MergeWithEarlier<2>(static_cast<__mmask8>(same2), low);
    low = MergeWithEarlier<4>(static_cast<__mmask8>(same4), low);
    const auto ends = static_cast<__mmask8>(~(same1 >> 1) | 0x80);  // the last lane of each word
    const int n = __builtin_popcount(ends);
    const uint64_t q0 = (static_cast<uint64_t>(fill_bits) + group_bit[8 * b]) >> 6;
    const uint64_t carry = q0 == last_q ? last : spill;
    const __m512i spills = _mm512_maskz_compress_epi64(ends, high);
    // lane j: the bits of word q0 + j; lane n: the last group's spill into word q0 + n
    const __m512i out = _mm512_or_si512(_mm512_maskz_compress_epi64(ends, low),
                                        _mm512_alignr_epi64(spills, _mm512_set1_epi64(static_cast<int64_t>(carry)), 7));
    const __m512i lane = _mm512_set1_epi64(n - 1);
    last_q = q0 + static_cast<uint64_t>(n) - 1;
    last = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm512_castsi512_si128(_mm512_permutexvar_epi64(lane, out))));
    spill = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm512_castsi512_si128(_mm512_permutexvar_epi64(lane, spills))));
    // Lanes past n (and a spill past lane 7) are written by the next block or the bit writer.
    const size_t first_byte = 8 * q0;
    const size_t room = size - first_byte;
    if (room >= 64) {
      _mm512_storeu_si512(word + first_byte, out);
    } else {
      _mm512_mask_storeu_epi8(word + first_byte, (__mmask64{1} << room) - 1, out);
    }
  }
  const uint64_t end = static_cast<uint64_t>(fill_bits) + end_bit;
  return BitCursor{end >> 6, static_cast<int>(end & 63), (end >> 6) == last_q ? last : spill};
}

// Each group word holds whole bytes, so a byte permutation lays a block's words end to end.
// Stores run a full 64 bytes while they stay inside the output (later blocks overwrite the excess)
// and are masked to the block's bytes after that.
AMAQ_AVX512 void PackByteAlignedBlocks(const uint8_t* codes, int64_t blocks,
                                       const uint16_t* pair_shift, const uint32_t* quad_shift,
                                       const uint64_t* group_shift, const uint8_t* gather,
                                       const uint8_t* block_bytes, uint8_t* out, size_t size) {
  size_t at = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512i words = JoinBlock(codes + 64 * b, pair_shift + 32 * b, quad_shift + 16 * b,
                                    group_shift + 8 * b);
    const __m512i bytes = _mm512_permutexvar_epi8(_mm512_loadu_si512(gather + 64 * b), words);
    const unsigned n = block_bytes[b];
    if (at + 64 <= size) {
      _mm512_storeu_si512(out + at, bytes);
    } else {
      _mm512_mask_storeu_epi8(out + at, n == 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1, bytes);
    }
    at += n;
  }
}

// Each code lies within two neighbouring bytes (width <= 8): a byte permutation of a 64-byte
// window brings those two bytes into the code's 16-bit lane, a variable shift and a mask finish.
// A chunk's 32 codes span at most 33 bytes of its window.
AMAQ_AVX512 void ExtractChunks(const uint8_t* packed, size_t size, uint64_t row_bit, int64_t chunks,
                               const uint32_t* chunk_start, const uint16_t* offset,
                               const uint16_t* mask, uint8_t* codes) {
  for (int64_t k = 0; k < chunks; ++k) {
    const uint64_t bit = row_bit + chunk_start[k];
    const uint64_t byte = bit >> 3;
    const uint64_t left = size - byte;  // > 0: the chunk's codes are in the stream
    const __m512i window = left >= 64 ? _mm512_loadu_si512(packed + byte)
                                      : _mm512_maskz_loadu_epi8((uint64_t{1} << left) - 1, packed + byte);
    const __m512i rel = _mm512_add_epi16(_mm512_loadu_si512(offset + 32 * k),
                                         _mm512_set1_epi16(static_cast<int16_t>(bit & 7)));
    const __m512i first = _mm512_srli_epi16(rel, 3);
    const __m512i index =
        _mm512_or_si512(first, _mm512_slli_epi16(_mm512_add_epi16(first, _mm512_set1_epi16(1)), 8));
    const __m512i two_bytes = _mm512_permutexvar_epi8(index, window);
    const __m512i value = _mm512_and_si512(
        _mm512_srlv_epi16(two_bytes, _mm512_and_si512(rel, _mm512_set1_epi16(7))),
        _mm512_loadu_si512(mask + 32 * k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * k), _mm512_cvtepi16_epi8(value));
  }
}

namespace {

// common/base/half.h's FloatToBFloat16 for finite x: (bits + 0x7fff + bit 16) >> 16.
AMAQ_AVX512 inline __m256i ToBFloat16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

AMAQ_AVX512 inline __m512 FromFloat16(__m256i h, bool bf16) {
  return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

}  // namespace

AMAQ_AVX512 int64_t NarrowFloats(const float* x, int64_t n, bool bf16, uint8_t* out,
                                 float* reconstruction) {
  const __m256i exponent = _mm256_set1_epi16(static_cast<int16_t>(bf16 ? 0x7f80 : 0x7c00));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m256i h = bf16 ? ToBFloat16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (_mm256_cmpeq_epi16_mask(_mm256_and_si256(h, exponent), exponent) != 0) return i;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), h);
    if (reconstruction) _mm512_storeu_ps(reconstruction + i, FromFloat16(h, bf16));
  }
  return i;
}

AMAQ_AVX512 void WidenFloats(const uint8_t* in, int64_t n, bool bf16, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i));
    _mm512_storeu_ps(out + i, FromFloat16(h, bf16));
  }
  if (i < n) {
    const __mmask16 m = FirstLanes(n - i);
    _mm512_mask_storeu_ps(out + i, m, FromFloat16(_mm256_maskz_loadu_epi16(m, in + 2 * i), bf16));
  }
}

}  // namespace amaq::quant::avx512

#else  // not x86-64: ActiveIsa() is never kAvx512, so these are never called

#include <cstdlib>

namespace amaq::quant::avx512 {
void QuantizeRowsPerChannel(const float*, int64_t, int64_t, const float*, const float*, const float*, uint8_t*) { std::abort(); }
void DequantizeRowPerChannel(const uint8_t*, int64_t, const float*, const float*, float*, bool) { std::abort(); }
void QuantizeRun(const float*, int64_t, float, float, float, uint8_t*) { std::abort(); }
void DequantizeRun(const uint8_t*, int64_t, float, float, float*) { std::abort(); }
void RangeOfRun(const float*, int64_t, float*, float*, float*) { std::abort(); }
void RangeOfColumns(const float*, int64_t, int64_t, float*, float*, float*) { std::abort(); }
BitCursor DepositBlocks(const uint8_t*, int64_t, const uint16_t*, const uint32_t*, const uint64_t*, const uint64_t*, uint64_t, uint8_t*, size_t, int, uint64_t) { std::abort(); }
void PackByteAlignedBlocks(const uint8_t*, int64_t, const uint16_t*, const uint32_t*, const uint64_t*, const uint8_t*, const uint8_t*, uint8_t*, size_t) { std::abort(); }
void ExtractChunks(const uint8_t*, size_t, uint64_t, int64_t, const uint32_t*, const uint16_t*, const uint16_t*, uint8_t*) { std::abort(); }
int64_t NarrowFloats(const float*, int64_t, bool, uint8_t*, float*) { std::abort(); }
void WidenFloats(const uint8_t*, int64_t, bool, float*) { std::abort(); }
}  // namespace amaq::quant::avx512

#endif
