#include "server/step_worker.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <stdexcept>

#include "server/split_server.h"

namespace amaq::server {

void ReturnMemoryAfter(size_t freed_bytes) {
  constexpr size_t kTrimAfterBytes = size_t{8} << 20;
  if (freed_bytes >= kTrimAfterBytes) malloc_trim(0);
}

namespace {

BatchOptions Resolved(BatchOptions options, const SplitServer& server) {
  if (options.max_tokens == BatchOptions::kAuto) {
    options.max_tokens = server.device() == "cpu" ? 0 : BatchOptions::kGpuBatchTokens;
  }
  return options;
}

}  // namespace

StepWorker::StepWorker(SplitServer& server, BatchOptions options)
    : server_(server), options_(Resolved(options, server)), thread_([this] { Run(); }) {}

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

std::vector<size_t> PickBatch(const std::deque<QueuedStep>& queue, int64_t max_tokens) {
  if (queue.empty()) return {};
  std::vector<size_t> picked{0};
  if (queue[0].input.kind != StepKind::kTrain) return picked;
  std::set<std::string> clients{queue[0].client_id};
  int64_t rows = queue[0].input.batch, tokens = queue[0].input.tokens;
  for (size_t i = 1; i < queue.size(); ++i) {
    const QueuedStep& step = queue[i];
    if (!clients.insert(step.client_id).second || step.input.kind != StepKind::kTrain) continue;
    const int64_t longest = std::max(tokens, step.input.tokens);
    if ((rows + step.input.batch) * longest > max_tokens) continue;
    picked.push_back(i);
    rows += step.input.batch;
    tokens = longest;
  }
  return picked;
}

void StepWorker::Run() {
  const auto wait = std::chrono::duration<double, std::milli>(options_.wait_ms);
  while (true) {
    std::vector<QueuedStep> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      if (options_.wait_ms > 0 && options_.max_tokens > 0 && queue_.front().input.kind == StepKind::kTrain) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(wait);
        size_t queued = queue_.size();
        // Each new step may join the batch; stop waiting when the batch would not grow.
        while (!stopping_ && ready_.wait_until(lock, until, [&] { return stopping_ || queue_.size() > queued; })) {
          queued = queue_.size();
        }
      }
      std::vector<size_t> picked = PickBatch(queue_, options_.max_tokens);
      for (const size_t i : picked) batch.push_back(std::move(queue_[i]));
      for (auto it = picked.rbegin(); it != picked.rend(); ++it) queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
    ++batches_;
    batched_steps_ += static_cast<int64_t>(batch.size());
    RunBatch(std::move(batch));
  }
}

void StepWorker::RunBatch(std::vector<QueuedStep> steps) {
  std::vector<SplitServer::BatchEntry> batch(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    batch[i].client_id = steps[i].client_id;
    batch[i].input = &steps[i].input;
  }
  try {
    server_.StepBatch(batch);
  } catch (...) {  // StepBatch reports each step's error in its entry; this is anything beyond
    for (auto& entry : batch) {
      if (!entry.error) entry.error = std::current_exception();
    }
  }
  size_t activation_bytes = 0;
  std::vector<int64_t> step_ids;
  for (auto& step : steps) {
    step_ids.push_back(step.input.step_id);
    activation_bytes += step.input.activation.size();
    step.input = StepInput{};
  }
  ReturnMemoryAfter(activation_bytes);
  for (size_t i = 0; i < steps.size(); ++i) {
    StepSink* sink = steps[i].sink;
    const int64_t step_id = step_ids[i];
    if (!batch[i].error) {
      sink->StepDone(std::move(batch[i].result));
      continue;
    }
    try {
      std::rethrow_exception(batch[i].error);
    } catch (const std::exception& e) {
      sink->StepFailed(step_id, e);
    } catch (...) {
      sink->StepFailed(step_id, std::runtime_error("a step failed with an exception that is not a std::exception"));
    }
  }
}

}  // namespace amaq::server
