// What a fp32 and a bf16 matrix product reach through LibTorch on this machine, and which BLAS
// library the process actually loaded (Debian's reference BLAS is ~12x slower than OpenBLAS).
// BM_ServerProduct: the fp32 products of amaq-base's server layers, [m x k] x [k x n], for the
// rows of 1, 8 and 16 steps of 16 x 48 tokens (what batching several clients' steps makes of them).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <string>
#include <thread>

namespace {

std::string LoadedBlas() {
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  while (std::getline(maps, line)) {
    if (line.find("blas") != std::string::npos) found = line.substr(line.find('/'));
  }
  return found.empty() ? "none mapped" : found;
}

void BM_Matmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto dtype = state.range(1) ? torch::kBFloat16 : torch::kFloat32;
  torch::set_num_threads(static_cast<int>(state.range(2)));
  torch::NoGradGuard no_grad;
  const auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
  for (auto _ : state) benchmark::DoNotOptimize(torch::mm(a, b).data_ptr());
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(n * n * n), benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Matmul)
    ->ArgNames({"n", "bf16", "threads"})
    ->Args({1024, 0, 1})->Args({1024, 0, 2})->Args({1024, 1, 1})->Args({1024, 1, 2})
    ->Unit(benchmark::kMillisecond);

void BM_ServerProduct(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  torch::NoGradGuard no_grad;
  const auto a = torch::randn({m, k}), b = torch::randn({k, n});
  for (auto _ : state) benchmark::DoNotOptimize(torch::mm(a, b).data_ptr());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * k * n),
                                                 benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ServerProduct)
    ->ArgNames({"m", "k", "n"})
    ->ArgsProduct({{768, 6144, 12288}, {256}, {688, 4096}})
    ->Args({768, 688, 256})->Args({6144, 688, 256})->Args({12288, 688, 256})
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  torch::zeros({2, 2}).mm(torch::zeros({2, 2}));  // load the BLAS before reading the maps
  std::cout << "BLAS library loaded: " << LoadedBlas() << "\n";
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
