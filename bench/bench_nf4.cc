// NF4 rows rebuilt for a product (common/model/nf4_rows.h): one pass over the codes, AVX-512 and
// portable, against the tensor operations that did it before (Nf4Weight::DenseRowsByTensorOps), on
// the block of rows FrozenWeight rebuilds at a time for one of SmolLM2's MLP projections (1,536 x
// 576: 884,736 weights, about 3.4 MiB of fp32), in fp32 and bf16, at 1 and 2 threads.
// Bytes/s counts the rows written.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "common/model/nf4_rows.h"
#include "common/model/nf4_weight.h"

namespace {

enum Path { kTensorOps, kPortable, kAvx512 };

void BM_Nf4Rows(benchmark::State& state) {
  const auto path = static_cast<Path>(state.range(0));
  const torch::Dtype dtype = state.range(1) ? torch::kBFloat16 : torch::kFloat;
  torch::set_num_threads(static_cast<int>(state.range(2)));
  if (path == kAvx512 && !amaq::Nf4HasAvx512()) {
    state.SkipWithError("this CPU has no AVX-512F");
    return;
  }
  torch::manual_seed(1);
  const int64_t out = 1536, in = 576;
  const amaq::Nf4Weight w = amaq::Nf4Weight::Quantize(torch::randn({out, in}) * 0.02);
  for (auto _ : state) {
    torch::Tensor rows;
    if (path == kTensorOps) {
      rows = w.DenseRowsByTensorOps(0, out, dtype);
    } else {
      rows = torch::empty({out, in}, torch::dtype(dtype));
      const auto rebuild = [&](auto* values) {
        path == kAvx512 ? amaq::RebuildNf4RowsAvx512(w.View(), 0, out * in, values)
                        : amaq::RebuildNf4RowsPortable(w.View(), 0, out * in, values);
      };
      if (dtype == torch::kFloat) {
        rebuild(rows.data_ptr<float>());
      } else {
        rebuild(reinterpret_cast<uint16_t*>(rows.data_ptr<at::BFloat16>()));
      }
    }
    benchmark::DoNotOptimize(rows.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * out * in * static_cast<int64_t>(torch::elementSize(dtype)));
  state.SetLabel(std::string(path == kTensorOps ? "tensor ops" : path == kPortable ? "one pass, portable" : "one pass, AVX-512") +
                 (dtype == torch::kFloat ? ", fp32" : ", bf16"));
}
BENCHMARK(BM_Nf4Rows)->ArgsProduct({{kTensorOps, kPortable, kAvx512}, {0, 1}, {1, 2}})->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
