// The element loops of quantization over raw float buffers: a run of values that share one
// (zero, step, max_code), or a row whose every column has its own (per-channel scales). These are
// the codec's hot loops, written so that the compiler vectorizes them; they give the same codes on
// every machine (the library is built with -ffp-contract=off).
//
//   nearest:    code = round_half_even(clamp((x - zero) * inv_step, 0, max_code))
//   stochastic: code = min(floor(clamp((x - zero) * inv_step, 0, max_code) + r), max_code),
//               r ~ U[0, 1)
//   dequantize: x_hat = zero + code * step
// with inv_step = 1.0f / step computed in fp32 by the caller.
//
// round_half_even is computed as (u + 2^23) - 2^23, which equals std::nearbyint and torch.round
// for 0 <= u <= 255 without needing SSE4.1.
#pragma once

#include <cstdint>

// Hot loops are compiled twice on x86-64, for AVX2 and for the baseline, and the loader picks the
// best one the CPU runs (GCC/Clang function multiversioning). Both give identical results: the
// same IEEE operations, no FMA contraction.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define AMAQ_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define AMAQ_VECTOR_CLONES
#endif

namespace amaq::quant {

void QuantizeRun(const float* x, int64_t n, float zero, float inv_step, float max_code,
                 uint8_t* codes);
void QuantizeRunStochastic(const float* x, int64_t n, float zero, float inv_step, float max_code,
                           uint64_t* rng_state, uint8_t* codes);
void DequantizeRun(const uint8_t* codes, int64_t n, float zero, float step, float* out);

// `rows` consecutive rows of n values (x and codes row-major) under the same per-channel scales.
void QuantizeRowsPerChannel(const float* x, int64_t rows, int64_t n, const float* zeros,
                            const float* inv_steps, const float* max_codes, uint8_t* codes);
void QuantizeRowPerChannelStochastic(const float* x, int64_t n, const float* zeros,
                                     const float* inv_steps, const float* max_codes,
                                     uint64_t* rng_state, uint8_t* codes);
// `bypass_cache`: `out` is part of an output too large for the caches, so it may be written
// around them (non-temporal stores, where the ISA has them); the values are the same.
void DequantizeRowPerChannel(const uint8_t* codes, int64_t n, const float* zeros,
                             const float* steps, float* out, bool bypass_cache = false);

}  // namespace amaq::quant
