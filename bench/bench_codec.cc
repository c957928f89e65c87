// Codec throughput on a [4096 tokens x 4096 channels] fp32 tensor, one thread: quantize+pack
// (Encode) and unpack+dequantize (Decode) in GB/s of fp32 input, next to memcpy of the same buffer.
// Counters: payload and metadata bytes of one message, and metadata as a share of payload. And
// AQ-SGD's sender encoding deltas.
#include <benchmark/benchmark.h>

#include <cstring>

#include "quant/aqsgd.h"
#include "quant/codec.h"
#include "quant/isa.h"
#include "test_tensors.h"

namespace amaq::quant {
namespace {

constexpr int64_t kRows = 4096, kCols = 4096;

const std::vector<float>& Input() {
  static const std::vector<float> x = testing::GaussianTensor(kRows, kCols, 42);
  return x;
}

// bits 0 means mixed per-channel widths 3..8 (AMAQ-like, average 5.5).
BitsTable Table(int bits) {
  if (bits > 0) return BitsTable::Uniform(bits);
  std::vector<uint8_t> widths(kCols);
  for (int64_t c = 0; c < kCols; ++c) widths[c] = static_cast<uint8_t>(3 + c % 6);
  return BitsTable::PerChannel(widths);
}

// Arg 3 picks the kernels: 1 the best the CPU has, 0 the portable ones; the label names them.
void ChooseIsa(benchmark::State& state) {
  const Isa isa = state.range(3) != 0 && CpuSupports(Isa::kAvx512) ? Isa::kAvx512 : Isa::kPortable;
  SetIsa(isa);
  state.SetLabel(ToString(isa));
}

EncodeOptions Options(const benchmark::State& state) {
  EncodeOptions o;
  o.zstd = state.range(1) != 0;
  o.scheme = static_cast<Scheme>(state.range(2));
  if (state.range(4) != 0) o.granularity = Granularity::kToken;
  return o;
}

void SetCounters(benchmark::State& state, const Encoded& e) {
  state.SetBytesProcessed(state.iterations() * kRows * kCols * 4);
  state.counters["payload_MiB"] = static_cast<double>(e.count.payload) / (1 << 20);
  state.counters["metadata_KiB"] = static_cast<double>(e.count.metadata) / 1024;
  state.counters["metadata_pct"] = 100.0 * static_cast<double>(e.count.metadata) / static_cast<double>(e.count.payload);
  state.counters["avg_bits"] = e.average_bits;
}

void BM_Memcpy(benchmark::State& state) {
  const auto& x = Input();
  std::vector<float> out(x.size());
  for (auto _ : state) {
    std::memcpy(out.data(), x.data(), x.size() * sizeof(float));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kRows * kCols * 4);
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

void BM_Encode(benchmark::State& state) {
  const auto& x = Input();
  const BitsTable bits = Table(static_cast<int>(state.range(0)));
  ChooseIsa(state);
  Encoded e;  // reused, as a client reuses its buffers from step to step: steady state from the start
  Encoder().Encode(x.data(), kRows, kCols, bits, Options(state), &e);
  for (auto _ : state) {
    Encoder encoder;  // a fresh stream: the bits table is sent every time
    encoder.Encode(x.data(), kRows, kCols, bits, Options(state), &e);
    benchmark::DoNotOptimize(e.bytes.data());
  }
  SetCounters(state, e);
}

void BM_Decode(benchmark::State& state) {
  const auto& x = Input();
  const BitsTable bits = Table(static_cast<int>(state.range(0)));
  ChooseIsa(state);
  const Encoded e = Encoder().Encode(x.data(), kRows, kCols, bits, Options(state));
  Decoded d;  // reused, as a server reuses its buffers from step to step: steady state from the start
  Decoder().Decode(e.bytes.data(), e.bytes.size(), &d);
  for (auto _ : state) {
    Decoder().Decode(e.bytes.data(), e.bytes.size(), &d);
    benchmark::DoNotOptimize(d.values.data());
  }
  SetCounters(state, e);
}

// AQ-SGD's sender on its second visit of 64 samples of 64 x 4096 (the input above): every sample
// a 4-bit delta on its cached entry (the entries then move by each delta, as in training).
void BM_AqsgdEncode(benchmark::State& state) {
  const auto& x = Input();
  std::vector<uint64_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  AqsgdSender sender(AqsgdOptions{});
  Encoded e = sender.Encode(x.data(), ids, kRows / 64, kCols);
  for (auto _ : state) {
    e = sender.Encode(x.data(), ids, kRows / 64, kCols);
    benchmark::DoNotOptimize(e.bytes.data());
  }
  SetCounters(state, e);
}
BENCHMARK(BM_AqsgdEncode)->Unit(benchmark::kMillisecond);

// Args: {bits (0 = mixed 3..8 per channel), zstd, scheme (3 affine; 4 symmetric, AQ-SGD's deltas;
// 2 the fp16 cast and 1 the bf16 cast, bits unused), kernels (1 the best this CPU runs, 0 portable),
// token (1: per-token scales, as the default method's gradients; 0: per-channel)}
#define AMAQ_CODEC_ARGS                                                                         \
  ArgNames({"bits", "zstd", "scheme", "best", "token"})                                         \
      ->Args({3, 0, 3, 1, 0})->Args({4, 0, 3, 1, 0})->Args({8, 0, 3, 1, 0})->Args({0, 0, 3, 1, 0}) \
      ->Args({3, 1, 3, 1, 0})->Args({8, 1, 3, 1, 0})->Args({4, 0, 4, 1, 0})                       \
      ->Args({16, 0, 2, 1, 0})->Args({16, 0, 1, 1, 0})->Args({16, 0, 2, 0, 0})                    \
      ->Args({4, 0, 4, 1, 1})->Args({4, 0, 4, 0, 1})                                              \
      ->Args({3, 0, 3, 0, 0})->Args({4, 0, 3, 0, 0})->Args({8, 0, 3, 0, 0})->Args({0, 0, 3, 0, 0}) \
      ->Unit(benchmark::kMillisecond)
BENCHMARK(BM_Encode)->AMAQ_CODEC_ARGS;
BENCHMARK(BM_Decode)->AMAQ_CODEC_ARGS;

}  // namespace
}  // namespace amaq::quant

BENCHMARK_MAIN();
