// The server's compute stage under many clients, batched against one step at a time: a SplitServer
// (per-client LoRA) and its StepWorker in this process, fed by N replaying clients. Each client
// is a thread that encodes a fixed random activation with its own codec (AMAQ 8->3) and waits for
// its step's outcome before sending the next, as a real client does; replaying costs ~0.1 ms a
// step, so the cores measure the server's layers (forward + backward), not the clients'.
// Reports, for 1, 4, 8, 16 and 64 clients, batched (batch_tokens 65536) and unbatched (0):
// samples/s of the server's layers, step latency p50/p99 (submit to outcome, queueing included),
// compute milliseconds per sample, the mean clients per batch, and the process's peak memory.
//   bench_batching [MODEL_DIR] [THREADS] [CLIENTS...]   (defaults: models/amaq-base 2 1 4 8 16 64)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/model/checkpoint.h"
#include "common/model/threads.h"
#include "process.h"
#include "quant/method.h"
#include "server/split_server.h"
#include "server/step_worker.h"

using namespace amaq;

namespace {

constexpr int64_t kRows = 16, kTokens = 48;  // one client's step: what scripts/bench load sends
const char* const kMethod = "amaq:8->3";

// Waits for one step's outcome.
class Outcome : public server::StepSink {
 public:
  void StepDone(StepResult) override { Finish(); }
  void StepFailed(int64_t step_id, const std::exception& error) override {
    std::fprintf(stderr, "step %lld failed: %s\n", static_cast<long long>(step_id), error.what());
    ++failures;
    Finish();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return finished_; });
    finished_ = false;
  }
  std::atomic<int> failures{0};

 private:
  void Finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    done_.notify_one();
  }
  std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

struct Round {
  double samples_per_second, p50_ms, p99_ms, ms_per_sample;
  int failures;
};

Round Run(const std::string& model, int clients, int64_t steps, int64_t batch_tokens) {
  server::ServerOptions o;
  o.model_dir = model;
  server::SplitServer server(o);
  const std::string fingerprint = ModelFingerprint(model, o.cut_layer, BaseWeights::kFp32);
  const int64_t hidden = server.config().hidden_size;
  std::vector<std::unique_ptr<quant::ClientCodec>> codecs;
  for (int c = 0; c < clients; ++c) {
    server.Join("replay-" + std::to_string(c), fingerprint, o.cut_layer, kMethod);
    quant::CodecContext context;
    context.channels = hidden;
    codecs.push_back(quant::Method::Parse(kMethod)->MakeClientCodec(context));
  }
  server::BatchOptions batching;
  batching.max_tokens = batch_tokens;
  std::vector<double> latency_ms(static_cast<size_t>(clients * steps));
  std::atomic<int> failures{0};
  const auto start = std::chrono::steady_clock::now();
  {
    server::StepWorker worker(server, batching);
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        torch::manual_seed(static_cast<uint64_t>(c));
        const torch::Tensor x = torch::randn({kRows * kTokens, hidden});
        StepInput in;
        in.batch = kRows;
        in.tokens = kTokens;
        in.mask.assign(static_cast<size_t>(kRows * kTokens), 1);
        for (int64_t i = 0; i < kRows * kTokens; ++i) in.labels.push_back(static_cast<int32_t>((i * 7 + c) % 4096));
        Outcome outcome;
        for (int64_t step = 0; step < steps; ++step) {
          torch::Tensor upstream;
          in.step_id = step;
          in.activation = codecs[static_cast<size_t>(c)]->EncodeTraining(x, quant::SampleRows{kRows, kTokens, {}}, &upstream).bytes;
          const auto sent = std::chrono::steady_clock::now();
          worker.Submit({"replay-" + std::to_string(c), in, &outcome});
          outcome.Wait();
          latency_ms[static_cast<size_t>(c * steps + step)] =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent).count();
        }
        failures += outcome.failures;
      });
    }
    for (auto& t : threads) t.join();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double samples = static_cast<double>(clients * steps * kRows);
  return {samples / seconds, Percentile(latency_ms, 0.5), Percentile(latency_ms, 0.99), seconds * 1e3 / samples, failures};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "models/amaq-base";
  const int threads = argc > 2 ? std::stoi(argv[2]) : 2;
  SetComputeThreads(threads);
  spdlog::set_level(spdlog::level::warn);
  std::printf("server compute under N replaying clients: %s, per-client LoRA, steps of %lld x %lld tokens (%s), "
              "%d compute threads, %u cores\n",
              model.c_str(), static_cast<long long>(kRows), static_cast<long long>(kTokens), kMethod, threads,
              std::thread::hardware_concurrency());
  std::printf("%8s %10s %12s %10s %10s %14s %8s %10s\n", "clients", "batching", "samples/s", "p50 ms", "p99 ms",
              "ms/sample", "failed", "peak MiB");
  std::vector<int> rounds;
  for (int i = 3; i < argc; ++i) rounds.push_back(std::stoi(argv[i]));
  if (rounds.empty()) rounds = {1, 4, 8, 16, 64};
  for (const int clients : rounds) {
    const int64_t steps = clients >= 64 ? 3 : clients >= 16 ? 6 : 12;
    for (const int64_t batch_tokens : {int64_t{0}, int64_t{65536}}) {
      const Round r = Run(model, clients, steps, batch_tokens);
      std::printf("%8d %10s %12.1f %10.1f %10.1f %14.3f %8d %10.0f\n", clients, batch_tokens > 0 ? "batched" : "one-by-one",
                  r.samples_per_second, r.p50_ms, r.p99_ms, r.ms_per_sample, r.failures,
                  testing::ProcStatusMiB(getpid(), "VmHWM"));
      std::fflush(stdout);
    }
  }
  return 0;
}
