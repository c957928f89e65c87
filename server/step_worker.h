// StepWorker: the compute stage of the server, behind a typed queue. The network layer submits
// complete, reassembled steps; one worker thread takes them oldest first, gathers the training
// steps of several clients into one batch (SplitServer::StepBatch: one forward and backward for
// all of them) and tells each step's sink its outcome. Other transports plug in here too.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/split_step.h"

namespace amaq::server {

class SplitServer;  // server/split_server.h: the worker holds a reference only, so this header needs no LibTorch

// Who waits for a step's outcome. Exactly one of the two is called per submitted step, on the
// worker thread, after the step's input has been freed.
class StepSink {
 public:
  virtual ~StepSink() = default;
  virtual void StepDone(StepResult result) = 0;
  virtual void StepFailed(int64_t step_id, const std::exception& error) = 0;
};

struct QueuedStep {
  std::string client_id;
  StepInput input;
  StepSink* sink = nullptr;  // must stay alive until it has been told the outcome
};

// How the worker gathers a batch (docs/protocol.md, "Batching").
struct BatchOptions {
  // Most rows x tokens (rows padded to the longest step) one batch holds; a larger step runs
  // alone, and 0 runs every step alone. kAuto: kGpuBatchTokens on a GPU; 0 on a CPU, where a
  // step is already bound by arithmetic and a batch ran slower (docs/benchmarks.md, "Batching").
  static constexpr int64_t kAuto = -1, kGpuBatchTokens = 16384;
  int64_t max_tokens = kAuto;
  // How long the worker waits for more steps once it has one that leaves room (0: it takes what
  // is queued).
  double wait_ms = 0;
};

// The queued steps (indices into `queue`, oldest first) that form the next batch: the oldest
// step; then, while the batch is TRAIN steps only, each later TRAIN step of a client not yet in
// the batch whose rows fit `max_tokens` with the batch's. A client's later steps stay behind its
// earliest, so its steps keep their order, and no client waits behind another's queued steps for
// more than one batch each.
std::vector<size_t> PickBatch(const std::deque<QueuedStep>& queue, int64_t max_tokens);

class StepWorker {
 public:
  // `server` must outlive the worker.
  StepWorker(SplitServer& server, BatchOptions options);
  // Runs the steps still queued (their sinks are told), then stops the thread.
  ~StepWorker();
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  void Submit(QueuedStep step);
  // Batches run so far, and the steps they held (their ratio: the mean steps per batch).
  int64_t batches() const { return batches_; }
  int64_t batched_steps() const { return batched_steps_; }

 private:
  void Run();
  void RunBatch(std::vector<QueuedStep> steps);

  SplitServer& server_;
  const BatchOptions options_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<QueuedStep> queue_;
  bool stopping_ = false;
  std::atomic<int64_t> batches_{0}, batched_steps_{0};
  std::thread thread_;  // last: starts once the queue exists
};

// Large buffers (a big step's activation, its reply, a refused step's chunks) go back to the
// system when they are freed, so that a spike does not stay in the server's resident memory
// (glibc keeps freed memory in its arenas otherwise): call after freeing `freed_bytes`.
void ReturnMemoryAfter(size_t freed_bytes);

}  // namespace amaq::server
