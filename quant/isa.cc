#include "quant/isa.h"

#include <atomic>
#include <string>

#include "common/base/error.h"

namespace amaq::quant {
namespace {

Isa BestIsa() { return CpuSupports(Isa::kAvx512) ? Isa::kAvx512 : Isa::kPortable; }

std::atomic<Isa>& Chosen() {
  static std::atomic<Isa> chosen{BestIsa()};
  return chosen;
}

}  // namespace

bool CpuSupports(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return true;
    case Isa::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
#else
      return false;
#endif
  }
  return false;
}

Isa ActiveIsa() { return Chosen().load(std::memory_order_relaxed); }

void SetIsa(Isa isa) {
  Require(CpuSupports(isa), ErrorCode::kFailedPrecondition,
          "this CPU cannot run the codec's " + ToString(isa) +
              " kernels: use the portable ones");
  Chosen().store(isa, std::memory_order_relaxed);
}

std::string ToString(Isa isa) { return isa == Isa::kAvx512 ? "avx512" : "portable"; }

}  // namespace amaq::quant
