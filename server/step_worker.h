// StepWorker: the compute stage of the server, behind a typed queue. The network layer submits
// complete, reassembled steps; one worker thread runs them on the SplitServer in the order they
// arrived (one model, one device) and tells each step's sink its outcome. This queue is where the
// steps of several clients are to be gathered into one batch, and where other transports plug in.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/split_step.h"
#include "server/split_server.h"

namespace amaq::server {

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

class StepWorker {
 public:
  // `server` must outlive the worker.
  explicit StepWorker(SplitServer& server);
  // Runs the steps still queued (their sinks are told), then stops the thread.
  ~StepWorker();
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  void Submit(QueuedStep step);

 private:
  void Run();
  void RunOne(QueuedStep step);

  SplitServer& server_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<QueuedStep> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the queue exists
};

// Large buffers (a big step's activation, its reply, a refused step's chunks) go back to the
// system when they are freed, so that a spike does not stay in the server's resident memory
// (glibc keeps freed memory in its arenas otherwise): call after freeing `freed_bytes`.
void ReturnMemoryAfter(size_t freed_bytes);

}  // namespace amaq::server
