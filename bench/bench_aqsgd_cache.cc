// What keeping AQ-SGD's cache with a checkpoint costs: ActivationCache::Save (every entry to one
// file, fsynced and renamed) and Load (the file checked whole, then read into a cache) of 2,000
// samples of 48 x 256 fp32 (94 MiB: the WordNet study's training set at amaq-base's cut), in MiB/s
// of cache. Arg 0: the share of entries spilled to disk before the save (0 or 50 %), which Save
// streams from their files.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "quant/activation_cache.h"
#include "test_tensors.h"

namespace amaq::quant {
namespace {

constexpr int64_t kSamples = 2000, kCols = 256, kValues = 48 * kCols;
constexpr uint64_t kBytes = uint64_t{kSamples} * kValues * sizeof(float);

std::string Scratch(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/amaq-bench-cache-" + name + "-" +
                          std::to_string(getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

void Fill(ActivationCache& cache) {
  const std::vector<float> x = testing::GaussianTensor(1, kValues, 3);
  for (int64_t i = 0; i < kSamples; ++i) cache.Insert(static_cast<uint64_t>(i), x, kCols, static_cast<uint64_t>(i) + 1);
}

void BM_Save(benchmark::State& state) {
  const std::string dir = Scratch("save");
  const uint64_t memory = state.range(0) == 0 ? kBytes : kBytes / 2;
  ActivationCache cache(memory, dir + "/spill");
  Fill(cache);
  for (auto _ : state) cache.Save(dir + "/cache.aqsgd");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.counters["spilled_MiB"] = static_cast<double>(cache.stats().disk_bytes) / (1 << 20);
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Save)->Arg(0)->Arg(50)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Load(benchmark::State& state) {
  const std::string dir = Scratch("load");
  {
    ActivationCache cache(kBytes, "");
    Fill(cache);
    cache.Save(dir + "/cache.aqsgd");
  }
  for (auto _ : state) {
    ActivationCache cache(kBytes, "");
    cache.Load(dir + "/cache.aqsgd");
    benchmark::DoNotOptimize(cache.stats());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace amaq::quant

BENCHMARK_MAIN();
