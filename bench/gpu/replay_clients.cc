#include "bench/gpu/replay_clients.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/model/checkpoint.h"
#include "quant/method.h"
#include "server/split_server.h"
#include "server/step_worker.h"

namespace amaq::bench {

namespace {

// Waits for one step's outcome at a time.
class Outcome : public server::StepSink {
 public:
  void StepDone(StepResult) override { Finish(); }
  void StepFailed(int64_t step_id, const std::exception& error) override {
    std::fprintf(stderr, "step %lld failed: %s\n", static_cast<long long>(step_id), error.what());
    ++failures_;
    Finish();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return finished_; });
    finished_ = false;
  }
  int failures() const { return failures_; }

 private:
  void Finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    done_.notify_one();
  }
  std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  std::atomic<int> failures_{0};
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

ReplayRound RunReplay(const ReplayOptions& options) {
  server::ServerOptions o;
  o.model_dir = options.model_dir;
  o.device = options.device;
  server::SplitServer server(o);
  const std::string fingerprint = ModelFingerprint(options.model_dir, o.cut_layer, BaseWeights::kFp32);
  const int64_t hidden = server.config().hidden_size, rows = options.rows, tokens = options.tokens;
  std::vector<std::unique_ptr<quant::ClientCodec>> codecs;
  for (int c = 0; c < options.clients; ++c) {
    server.Join("replay-" + std::to_string(c), fingerprint, o.cut_layer, options.method);
    quant::CodecContext context;
    context.channels = hidden;
    codecs.push_back(quant::Method::Parse(options.method)->MakeClientCodec(context));
  }
  server::BatchOptions batching;
  batching.max_tokens = options.batch_tokens;
  std::vector<double> latency_ms(static_cast<size_t>(options.clients * options.steps));
  std::atomic<int> failures{0};
  const auto start = std::chrono::steady_clock::now();
  {
    server::StepWorker worker(server, batching);
    std::vector<std::thread> threads;
    for (int c = 0; c < options.clients; ++c) {
      threads.emplace_back([&, c] {
        torch::manual_seed(static_cast<uint64_t>(c));
        const torch::Tensor x = torch::randn({rows * tokens, hidden});
        StepInput in;
        in.batch = rows;
        in.tokens = tokens;
        in.mask.assign(static_cast<size_t>(rows * tokens), 1);
        for (int64_t i = 0; i < rows * tokens; ++i) in.labels.push_back(static_cast<int32_t>((i * 7 + c) % server.config().vocab_size));
        Outcome outcome;
        for (int64_t step = 0; step < options.steps; ++step) {
          torch::Tensor upstream;
          in.step_id = step;
          in.activation = codecs[static_cast<size_t>(c)]->EncodeTraining(x, quant::SampleRows{rows, tokens, {}}, &upstream).bytes;
          const auto sent = std::chrono::steady_clock::now();
          worker.Submit({"replay-" + std::to_string(c), in, &outcome});
          outcome.Wait();
          latency_ms[static_cast<size_t>(c * options.steps + step)] =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent).count();
        }
        failures += outcome.failures();
      });
    }
    for (auto& t : threads) t.join();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double samples = static_cast<double>(options.clients * options.steps * rows);
  return {samples / seconds, Percentile(latency_ms, 0.5), Percentile(latency_ms, 0.99), seconds * 1e3 / samples, failures.load()};
}

}  // namespace amaq::bench
