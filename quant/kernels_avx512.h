// AVX-512 (F, BW, VL, VBMI) versions of the codec's hottest loops. Each gives exactly what its
// portable counterpart gives (the same IEEE operations in the same order per element, no FMA);
// callers reach them through the dispatch in quant/kernels.h, quant/grid.cc and quant/bitpack.h
// when ActiveIsa() is Isa::kAvx512, and must not call them on a CPU without it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace amaq::quant::avx512 {

// quant/kernels.h's per-channel loops; `bypass_cache` writes `out` with non-temporal stores.
void QuantizeRowsPerChannel(const float* x, int64_t rows, int64_t n, const float* zeros,
                            const float* inv_steps, const float* max_codes, uint8_t* codes);
void DequantizeRowPerChannel(const uint8_t* codes, int64_t n, const float* zeros,
                             const float* steps, float* out, bool bypass_cache);

// quant/kernels.h's loops over a run that shares one scale (nearest rounding).
void QuantizeRun(const float* x, int64_t n, float zero, float inv_step, float max_code, uint8_t* codes);
void DequantizeRun(const uint8_t* codes, int64_t n, float zero, float step, float* out);

// Min and max of n >= 1 values into *lo/*hi; adds NaN to *bad when a value is not finite.
void RangeOfRun(const float* x, int64_t n, float* lo, float* hi, float* bad);

// Per-column min and max over all rows into lo/hi (cols each); adds NaN to *bad when a value is
// not finite, 0 otherwise.
void RangeOfColumns(const float* x, int64_t rows, int64_t cols, float* lo, float* hi, float* bad);

// Where DepositBlocks leaves a bit stream: `word` 8-byte words after the one it started in, `fill`
// bits into that word, which hold `bits`.
struct BitCursor {
  uint64_t word;
  int fill;
  uint64_t bits;
};

// Packs `blocks` blocks of 64 codes into a bit stream whose word being filled starts at `word`
// (size bytes from there to the stream's end; fill_bits of it written, holding `bits`). Each group
// of eight codes is joined into one word (code j shifted by the widths of codes 0..j-1; the shift
// tables hold, per block, the width of the first code of each pair (32 entries), of the first
// pair of each quad (16) and of the first quad of each group (8)) and goes group_bit[8b + k] bits
// after the fill; the blocks end end_bit bits after it. The words before the returned cursor's
// are written; its own bits are in the cursor. Writes no byte at or past the stream's end.
BitCursor DepositBlocks(const uint8_t* codes, int64_t blocks, const uint16_t* pair_shift,
                        const uint32_t* quad_shift, const uint64_t* group_shift,
                        const uint64_t* group_bit, uint64_t end_bit, uint8_t* word, size_t size,
                        int fill_bits, uint64_t bits);

// The blocks of DepositBlocks when every group word is whole bytes (8 * block_bytes[b] bits in all):
// writes the blocks' bytes end to end into out, gather[64 * b + t] being the byte of the block's
// words that becomes its byte t. Writes no byte at or past out + size (size >= the blocks' bytes).
void PackByteAlignedBlocks(const uint8_t* codes, int64_t blocks, const uint16_t* pair_shift,
                           const uint32_t* quad_shift, const uint64_t* group_shift,
                           const uint8_t* gather, const uint8_t* block_bytes, uint8_t* out,
                           size_t size);

// Extracts `chunks` chunks of 32 codes from the bit stream [packed, packed + size), the row
// starting at bit `row_bit`: chunk k starts chunk_start[k] bits into the row, and its code j
// `offset[32 * k + j]` bits into the chunk with `mask[32 * k + j]` = 2^width - 1. Reads no byte
// outside the stream.
void ExtractChunks(const uint8_t* packed, size_t size, uint64_t row_bit, int64_t chunks,
                   const uint32_t* chunk_start, const uint16_t* offset, const uint16_t* mask,
                   uint8_t* codes);

// The 16-bit float schemes (round to nearest even, as common/base/half.h): writes n finite floats as
// bfloat16 (`bf16`) or IEEE half into out (2n bytes, little-endian) and, when not null, their
// values back as floats into reconstruction. Stops before the first block of 16 holding a value
// that became infinite and returns its start (n when there is none): the caller finds it and says
// so. WidenFloats is the inverse of the bytes.
int64_t NarrowFloats(const float* x, int64_t n, bool bf16, uint8_t* out, float* reconstruction);
void WidenFloats(const uint8_t* in, int64_t n, bool bf16, float* out);

}  // namespace amaq::quant::avx512
