#include "quant/grid.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/base/error.h"
#include "common/base/half.h"
#include "quant/isa.h"
#include "quant/kernels.h"
#include "quant/kernels_avx512.h"

namespace amaq::quant {
namespace {

constexpr int kLanes = 16;  // independent partial minima/maxima: lets the compiler vectorize

// Min and max of n values; `bad` becomes NaN when any value is NaN or infinite (x - x != 0).
AMAQ_VECTOR_CLONES void RangeOfRun(const float* x, int64_t n, float* lo, float* hi, float* bad) {
  if (ActiveIsa() == Isa::kAvx512) {
    avx512::RangeOfRun(x, n, lo, hi, bad);
    return;
  }
  float part_lo[kLanes], part_hi[kLanes], part_bad[kLanes] = {};
  for (int j = 0; j < kLanes; ++j) part_lo[j] = part_hi[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = x[i + j];
      part_lo[j] = v < part_lo[j] ? v : part_lo[j];
      part_hi[j] = v > part_hi[j] ? v : part_hi[j];
      part_bad[j] += v - v;
    }
  }
  float l = part_lo[0], h = part_hi[0], b = 0.0f;
  for (int j = 0; j < kLanes; ++j) {
    l = std::min(l, part_lo[j]);
    h = std::max(h, part_hi[j]);
    b += part_bad[j];
  }
  for (; i < n; ++i) {
    l = std::min(l, x[i]);
    h = std::max(h, x[i]);
    b += x[i] - x[i];
  }
  *lo = l;
  *hi = h;
  *bad += b;
}

// Per-column min and max over all rows. The non-finite check keeps kLanes partial sums, so that no
// serial floating-point chain stops the loop from vectorizing.
AMAQ_VECTOR_CLONES void RangeOfColumns(const float* x, int64_t rows, int64_t cols, float* lo,
                                       float* hi, float* bad) {
  if (ActiveIsa() == Isa::kAvx512) {
    avx512::RangeOfColumns(x, rows, cols, lo, hi, bad);
    return;
  }
  std::copy(x, x + cols, lo);
  std::copy(x, x + cols, hi);
  float part_bad[kLanes] = {};
  const int64_t blocked = cols / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    for (int64_t c0 = 0; c0 < blocked; c0 += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float v = row[c0 + j];
        lo[c0 + j] = v < lo[c0 + j] ? v : lo[c0 + j];
        hi[c0 + j] = v > hi[c0 + j] ? v : hi[c0 + j];
        part_bad[j] += v - v;
      }
    }
    for (int64_t c = blocked; c < cols; ++c) {
      const float v = row[c];
      lo[c] = v < lo[c] ? v : lo[c];
      hi[c] = v > hi[c] ? v : hi[c];
      part_bad[0] += v - v;
    }
  }
  for (int j = 0; j < kLanes; ++j) *bad += part_bad[j];
}

[[noreturn]] void ThrowNonFinite(const float* x, int64_t rows, int64_t cols, bool received) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(x[i])) {
      const std::string element = "(" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + ") is " + std::to_string(x[i]);
      throw Error(ErrorCode::kInvalidArgument,
                  received ? "the message's float payload element " + element +
                                 ", not a finite number: an amaq sender refuses to send such a value, so the message was forged or its "
                                 "sender is faulty; it is refused"
                           : "tensor element " + element +
                                 ": tensors must be finite; the model that produced it has diverged "
                                 "(lower its learning rate or check its input data)");
    }
  }
  throw Error(ErrorCode::kInternal, "range check flagged a non-finite value that is not there");
}

struct GroupParams {
  float zero, step;
};

GroupParams AffineParams(float lo, float hi, int bits, ScaleFormat format) {
  const auto max_code = static_cast<float>(MaxCode(Scheme::kAffine, bits));
  float zero = lo;
  if (format == ScaleFormat::kFloat16) zero = HalfToFloat(FloatToHalf(lo, RoundDirection::kDown));
  float step = (hi - zero) / max_code;
  if (format == ScaleFormat::kFloat16) step = HalfToFloat(FloatToHalf(step, RoundDirection::kUp));
  if (step == 0.0f) step = 1.0f;
  return {zero, step};
}

float SymmetricStep(float lo, float hi, int bits, ScaleFormat format) {
  const float absmax = std::max(std::fabs(lo), std::fabs(hi));
  const auto center = static_cast<float>((1 << (bits - 1)) - 1);
  float step = absmax / center;
  if (format == ScaleFormat::kFloat16) step = HalfToFloat(FloatToHalf(step, RoundDirection::kUp));
  if (step == 0.0f) step = 1.0f;
  return step;
}


bool FillGrid(const std::vector<float>& lo, const std::vector<float>& hi, const GridSpec& spec,
              const BitsTable& bits, ScaleFormat format, ScaleGrid* grid) {
  grid->format = format;
  const size_t groups = lo.size();
  grid->steps.resize(groups);
  grid->zeros.resize(groups);
  bool fits = true;
  for (size_t g = 0; g < groups; ++g) {
    const int b = ScaleGroupBits(bits, static_cast<int64_t>(g));
    if (spec.scheme == Scheme::kAffine) {
      const GroupParams p = AffineParams(lo[g], hi[g], b, format);
      grid->zeros[g] = p.zero;
      grid->steps[g] = p.step;
      fits = fits && FitsHalfNormal(p.zero);
    } else {
      grid->steps[g] = SymmetricStep(lo[g], hi[g], b, format);
      grid->zeros[g] = SymmetricZero(grid->steps[g], b);
    }
    fits = fits && FitsHalfNormal(grid->steps[g]) && std::isfinite(grid->steps[g]);
  }
  return fits;
}

}  // namespace

void RequireFinite(const float* x, int64_t rows, int64_t cols, bool received) {
  if (rows <= 0 || cols <= 0) return;
  float lo, hi, bad = 0.0f;
  RangeOfRun(x, rows * cols, &lo, &hi, &bad);
  if (bad != 0.0f) ThrowNonFinite(x, rows, cols, received);
}

bool GroupDecodesFinite(Scheme scheme, float zero, float step, int bits) {
  return std::isfinite(zero) && std::isfinite(step) &&
         std::isfinite(zero + static_cast<float>(MaxCode(scheme, bits)) * step);
}

std::string NonFiniteGroupText(int64_t g, float zero, float step, int bits) {
  return "scale group " + std::to_string(g) + " (zero " + std::to_string(zero) + ", step " + std::to_string(step) +
         " at " + std::to_string(bits) + " bits) decodes to values beyond fp32's range: an encoder refuses such values "
         "(rescale the tensor or quantize it with more bits); a received message with it is corrupted";
}

int64_t ScaleGroupCount(const GridSpec& spec, int64_t rows, int64_t cols) {
  switch (spec.granularity) {
    case Granularity::kTensor: return 1;
    case Granularity::kChannel: return cols;
    case Granularity::kToken: return rows;
    case Granularity::kGroup: return rows * ((cols + spec.group_size - 1) / spec.group_size);
  }
  return 0;
}

void ValidateGridSpec(const GridSpec& spec, const BitsTable& bits, int64_t rows, int64_t cols) {
  Require(spec.scheme == Scheme::kAffine || spec.scheme == Scheme::kSymmetric,
          ErrorCode::kInvalidArgument,
          "scheme " + ToString(spec.scheme) + " has no scale grid: use affine or symmetric");
  Require(spec.granularity <= Granularity::kGroup, ErrorCode::kInvalidArgument,
          "unknown granularity " + std::to_string(static_cast<int>(spec.granularity)) +
              ": use per-tensor, per-channel, per-token or group");
  Require(spec.granularity != Granularity::kGroup || spec.group_size > 0,
          ErrorCode::kInvalidArgument,
          "group size must be positive, got " + std::to_string(spec.group_size) +
              ": use e.g. 64 or 128");
  bits.Validate(rows, cols);
  Require(bits.layout != BitsLayout::kPerChannel || spec.granularity == Granularity::kChannel,
          ErrorCode::kInvalidArgument,
          "per-channel bit-widths need per-channel scales (got " + ToString(spec.granularity) +
              "): use granularity per-channel");
  Require(bits.layout != BitsLayout::kPerToken || spec.granularity == Granularity::kToken,
          ErrorCode::kInvalidArgument,
          "per-token bit-widths need per-token scales (got " + ToString(spec.granularity) +
              "): use granularity per-token");
  if (spec.scheme == Scheme::kSymmetric) {
    for (uint8_t b : bits.bits) {
      Require(b >= 2, ErrorCode::kInvalidArgument,
              "symmetric quantization needs at least 2 bits (one level each side of 0), got " +
                  std::to_string(b) + ": use 2..8 bits or the affine scheme");
    }
  }
}

ScaleGrid ComputeGrid(const float* x, int64_t rows, int64_t cols, const GridSpec& spec,
                      const BitsTable& bits, ScaleFormat preferred) {
  ValidateGridSpec(spec, bits, rows, cols);
  const int64_t groups = ScaleGroupCount(spec, rows, cols);
  std::vector<float> lo(static_cast<size_t>(groups)), hi(static_cast<size_t>(groups));
  float bad = 0.0f;
  if (rows > 0 && cols > 0) {
    switch (spec.granularity) {
      case Granularity::kTensor:
        RangeOfRun(x, rows * cols, &lo[0], &hi[0], &bad);
        break;
      case Granularity::kChannel:
        RangeOfColumns(x, rows, cols, lo.data(), hi.data(), &bad);
        break;
      case Granularity::kToken:
        for (int64_t r = 0; r < rows; ++r) RangeOfRun(x + r * cols, cols, &lo[r], &hi[r], &bad);
        break;
      case Granularity::kGroup: {
        const int64_t per_row = (cols + spec.group_size - 1) / spec.group_size;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t k = 0; k < per_row; ++k) {
            const int64_t begin = k * spec.group_size;
            const int64_t n = std::min<int64_t>(spec.group_size, cols - begin);
            RangeOfRun(x + r * cols + begin, n, &lo[r * per_row + k], &hi[r * per_row + k], &bad);
          }
        }
        break;
      }
    }
  }
  if (bad != 0.0f) ThrowNonFinite(x, rows, cols, /*received=*/false);

  ScaleGrid grid;
  if (!FillGrid(lo, hi, spec, bits, preferred, &grid) && preferred != ScaleFormat::kFloat32) {
    FillGrid(lo, hi, spec, bits, ScaleFormat::kFloat32, &grid);
  }
  for (int64_t g = 0; g < groups; ++g) {
    const float zero = grid.zeros[static_cast<size_t>(g)], step = grid.steps[static_cast<size_t>(g)];
    const int b = ScaleGroupBits(bits, g);
    Require(GroupDecodesFinite(spec.scheme, zero, step, b), ErrorCode::kInvalidArgument,
            NonFiniteGroupText(g, zero, step, b));
  }
  return grid;
}

}  // namespace amaq::quant
