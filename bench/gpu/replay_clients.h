// RunReplay: the server's compute stage under N clients that only replay. A SplitServer
// (per-client LoRA) on options.device and its StepWorker run in this process; each client is a
// thread that encodes one fixed random activation with its own codec for every step (about 0.1 ms
// on a CPU) and waits for the step's outcome before sending the next, as a real client does, so
// the measured time is the server's. Used by bench_batching (batched against one step at a time
// on the CPU) and amaq-gpu-check's batching check (the same on a GPU).
#pragma once

#include <cstdint>
#include <string>

namespace amaq::bench {

struct ReplayOptions {
  std::string model_dir = "models/amaq-base";
  std::string device = "cpu";  // the server's: cpu or cuda
  int clients = 1;
  int64_t steps = 8;           // per client
  int64_t batch_tokens = 0;    // StepWorker's batch limit (0: each step alone)
  int64_t rows = 16, tokens = 48;  // one step: what scripts/bench load sends
  std::string method = "amaq:8->3";
};

struct ReplayRound {
  double samples_per_second = 0;  // rows of every client's steps over the wall time
  double p50_ms = 0, p99_ms = 0;  // step latency, submit to outcome (queueing included)
  double ms_per_sample = 0;
  int failures = 0;               // steps that failed (each is printed on stderr)
};

ReplayRound RunReplay(const ReplayOptions& options);

}  // namespace amaq::bench
