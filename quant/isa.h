// Which instruction set the codec's hot loops run on. Every path gives bit-identical codes, bytes
// and floats (tests/isa_test.cc compares them); only the speed differs.
//
//   kPortable: plain C++ (the element loops still get AVX2 clones, quant/kernels.h).
//   kAvx512:   hand-written AVX-512 (F, BW, VL, VBMI) kernels for quantization (per channel
//              and per run of one scale), the ranges, bit packing and the 16-bit casts
//              (quant/kernels_avx512.h).
//
// ActiveIsa() is the best the CPU supports, unless SetIsa chose another. The choice is one
// process-wide setting, read at the start of each kernel; change it only while no codec runs (a
// test or a benchmark between messages).
#pragma once

#include <string>

namespace amaq::quant {

enum class Isa { kPortable, kAvx512 };

bool CpuSupports(Isa isa);
Isa ActiveIsa();
// Throws amaq::Error (kFailedPrecondition) when the CPU lacks `isa`.
void SetIsa(Isa isa);
std::string ToString(Isa isa);

}  // namespace amaq::quant
