// What the copies between the codec's bytes and the protobuf messages cost per step, one thread.
// A step's activation goes from the codec's buffer into StepRequest chunks (StepRequests: one
// copy) and, on the server, from the chunks into one buffer again (StepAssembler: one copy); the
// gradient takes the same two copies back. BM_ChunkAndAssemble times those two copies of one
// message (with the messages' fields); BM_SerializeAndParse the serialization and parsing that
// gRPC does whatever the buffers are; BM_Memcpy one memcpy of the same bytes. Arg: the bytes of
// the message (393216: a bf16 step of 16 x 48 tokens x 256 channels; 73728: the same at 3 bits).
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include "proto/step_messages.h"
#include "server/step_assembler.h"

namespace amaq {
namespace {

constexpr int64_t kBatch = 16, kTokens = 48;

StepInput Step(int64_t bytes) {
  StepInput in;
  in.batch = kBatch;
  in.tokens = kTokens;
  for (int64_t r = 0; r < kBatch; ++r) in.sample_ids.push_back(static_cast<uint64_t>(r));
  in.mask.assign(kBatch * kTokens, 1);
  in.labels.assign(kBatch * kTokens, -100);
  for (int64_t r = 0; r < kBatch; ++r) in.labels[static_cast<size_t>((r + 1) * kTokens - 1)] = 7;
  in.activation.resize(static_cast<size_t>(bytes));
  for (size_t i = 0; i < in.activation.size(); ++i) in.activation[i] = static_cast<uint8_t>(i * 131);
  return in;
}

server::StepLimits Limits() {
  server::StepLimits limits;
  limits.shape.vocab_size = 4096;  // amaq-base's
  return limits;
}

void BM_ChunkAndAssemble(benchmark::State& state) {
  const StepInput in = Step(state.range(0));
  for (auto _ : state) {
    server::StepAssembler assembler(Limits());
    bool complete = false;
    for (const v1::StepRequest& chunk : StepRequests(in, size_t{1} << 20)) complete = assembler.Add(chunk);
    if (!complete) state.SkipWithError("the chunks did not make a step");
    benchmark::DoNotOptimize(assembler.Take().activation.data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_ChunkAndAssemble)->Arg(73728)->Arg(393216)->Unit(benchmark::kMicrosecond);

void BM_SerializeAndParse(benchmark::State& state) {
  const std::vector<v1::StepRequest> chunks = StepRequests(Step(state.range(0)), size_t{1} << 20);
  for (auto _ : state) {
    for (const v1::StepRequest& chunk : chunks) {
      v1::StepRequest parsed;
      parsed.ParseFromString(chunk.SerializeAsString());
      benchmark::DoNotOptimize(parsed.payload().data());
    }
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SerializeAndParse)->Arg(73728)->Arg(393216)->Unit(benchmark::kMicrosecond);

void BM_Memcpy(benchmark::State& state) {
  const std::vector<uint8_t> from(static_cast<size_t>(state.range(0)), 1);
  std::vector<uint8_t> to(from.size());
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size());
    benchmark::DoNotOptimize(to.data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Memcpy)->Arg(73728)->Arg(393216)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace amaq

BENCHMARK_MAIN();
