// The server's compute stage under many clients, batched against one step at a time, on the CPU:
// RunReplay (bench/gpu/replay_clients.h) for 1, 4, 8, 16 and 64 clients with batch_tokens 65536
// ("batched") and 0 ("one-by-one"). Prints samples/s of the server's layers (forward + backward),
// step latency p50/p99, compute milliseconds per sample and the process's peak memory so far.
//   bench_batching [MODEL_DIR] [THREADS] [CLIENTS...]   (defaults: models/amaq-base 2 1 4 8 16 64)
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/replay_clients.h"
#include "common/model/threads.h"
#include "process.h"

using namespace amaq;

int main(int argc, char** argv) {
  bench::ReplayOptions o;
  o.model_dir = argc > 1 ? argv[1] : "models/amaq-base";
  const int threads = argc > 2 ? std::stoi(argv[2]) : 2;
  std::vector<int> rounds;
  for (int i = 3; i < argc; ++i) rounds.push_back(std::stoi(argv[i]));
  if (rounds.empty()) rounds = {1, 4, 8, 16, 64};
  SetComputeThreads(threads);
  spdlog::set_level(spdlog::level::warn);
  std::printf("server compute under N replaying clients: %s, per-client LoRA, steps of %lld x %lld tokens (%s), "
              "%d compute threads, %u cores\n",
              o.model_dir.c_str(), static_cast<long long>(o.rows), static_cast<long long>(o.tokens), o.method.c_str(), threads,
              std::thread::hardware_concurrency());
  std::printf("%8s %10s %12s %10s %10s %14s %8s %10s\n", "clients", "batching", "samples/s", "p50 ms", "p99 ms",
              "ms/sample", "failed", "peak MiB");
  for (const int clients : rounds) {
    o.clients = clients;
    o.steps = clients >= 64 ? 3 : clients >= 16 ? 6 : 12;
    for (const int64_t batch_tokens : {int64_t{0}, int64_t{65536}}) {
      o.batch_tokens = batch_tokens;
      const bench::ReplayRound r = bench::RunReplay(o);
      std::printf("%8d %10s %12.1f %10.1f %10.1f %14.3f %8d %10.0f\n", clients, batch_tokens > 0 ? "batched" : "one-by-one",
                  r.samples_per_second, r.p50_ms, r.p99_ms, r.ms_per_sample, r.failures,
                  testing::ProcStatusMiB(getpid(), "VmHWM"));
      std::fflush(stdout);
    }
  }
  return 0;
}
