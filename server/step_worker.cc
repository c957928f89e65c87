#include "server/step_worker.h"

#include <malloc.h>

#include <stdexcept>

namespace amaq::server {

void ReturnMemoryAfter(size_t freed_bytes) {
  constexpr size_t kTrimAfterBytes = size_t{8} << 20;
  if (freed_bytes >= kTrimAfterBytes) malloc_trim(0);
}

StepWorker::StepWorker(SplitServer& server) : server_(server), thread_([this] { Run(); }) {}

StepWorker::~StepWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

void StepWorker::Submit(QueuedStep step) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(step));
  }
  ready_.notify_one();
}

void StepWorker::Run() {
  while (true) {
    QueuedStep step;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      step = std::move(queue_.front());
      queue_.pop_front();
    }
    RunOne(std::move(step));
  }
}

void StepWorker::RunOne(QueuedStep step) {
  StepResult result;
  std::exception_ptr error;
  try {
    result = server_.Step(step.client_id, step.input);
  } catch (...) {
    error = std::current_exception();
  }
  const int64_t step_id = step.input.step_id;
  const size_t activation_bytes = step.input.activation.size();
  StepSink* sink = step.sink;
  step = QueuedStep{};
  ReturnMemoryAfter(activation_bytes);
  if (!error) return sink->StepDone(std::move(result));
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    sink->StepFailed(step_id, e);
  } catch (...) {
    sink->StepFailed(step_id, std::runtime_error("a step failed with an exception that is not a std::exception"));
  }
}

}  // namespace amaq::server
