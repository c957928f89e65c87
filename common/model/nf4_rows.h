// NF4 weights rebuilt on the CPU in one pass: element i of the dequantized weights is
// level(code i) * scale of its block (common/model/nf4.h's layout: two codes a byte, element 2i in
// the low nibble; block scales double-quantized), written straight into fp32 or bf16 on
// LibTorch's intra-op threads (nf4_rows.cc is compiled with OpenMP, whose runtime LibTorch itself
// loads). The values are exactly quant::Nf4Weights::Dequantize's; bf16 is rounded to nearest
// even, as c10::BFloat16 rounds. RebuildNf4Rows takes the AVX-512 path where the CPU has AVX-512F
// (nf4_rows_avx512.cc) and the portable one elsewhere; both are exposed, and one thread's serial
// pass of each, so that tests compare them bit for bit. The view borrows the caller's storage,
// which must outlive the call.
#pragma once

#include <cstdint>

namespace amaq {

struct Nf4View {
  const float* levels;         // the 16 levels, quant::Nf4Levels()
  const uint8_t* codes;        // numel / 2 bytes
  const int8_t* scale_codes;   // one per block
  const float* scale_steps;    // one per group of scale_block blocks
  float scale_mean;
  int64_t block;               // weights per block: even
  int64_t scale_block;         // blocks per scale group
};

// Writes elements [first, first + count) of the dequantized weights to out[0, count); out_bf16
// writes bf16 (the raw 16 bits, as c10::BFloat16 holds them).
void RebuildNf4Rows(const Nf4View& w, int64_t first, int64_t count, float* out);
void RebuildNf4Rows(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16);

// The two paths RebuildNf4Rows chooses between. The AVX-512 one must only run where
// Nf4HasAvx512() is true.
bool Nf4HasAvx512();
void RebuildNf4RowsPortable(const Nf4View& w, int64_t first, int64_t count, float* out);
void RebuildNf4RowsPortable(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16);
void RebuildNf4RowsAvx512(const Nf4View& w, int64_t first, int64_t count, float* out);
void RebuildNf4RowsAvx512(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16);

// One thread's pass over [first, first + count) of each path, which the functions above split
// the range into (at block boundaries).
namespace nf4_serial {
void Portable(const Nf4View& w, int64_t first, int64_t count, float* out);
void Portable(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16);
void Avx512(const Nf4View& w, int64_t first, int64_t count, float* out);
void Avx512(const Nf4View& w, int64_t first, int64_t count, uint16_t* out_bf16);
}  // namespace nf4_serial

}  // namespace amaq
