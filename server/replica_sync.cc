#include "server/replica_sync.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <sstream>

#include "common/base/error.h"

namespace amaq::server {
namespace {

std::string Number(double value) {
  std::ostringstream text;
  text.precision(17);
  text << value;
  return text.str();
}

}  // namespace

ReplicaIdentity IdentityOf(const SplitServer& server, const ServerOptions& options) {
  std::string targets;
  for (const auto& t : options.lora.target_modules) targets += (targets.empty() ? "" : ",") + t;
  return {{"model_and_cut", server.fingerprint()},
          {"cut_layer", std::to_string(options.cut_layer)},
          {"base_weights", options.base_weights},
          {"compute_dtype", server.compute_dtype()},  // as resolved: "auto" may differ between hosts
          {"lora_rank", std::to_string(options.lora.rank)},
          {"lora_alpha", Number(options.lora.alpha)},
          {"lora_dropout", Number(options.lora.dropout)},
          {"lora_target_modules", targets},
          {"seed", std::to_string(options.seed)},
          {"lr", Number(options.lr)},
          {"max_grad_norm", Number(options.max_grad_norm)},
          {"shared_lora", options.shared_lora ? "true" : "false"}};
}

ReplicaSync::ReplicaSync(SplitServer& server, ReplicaGroup& group, double every_seconds)
    : server_(server), group_(group), every_seconds_(every_seconds) {
  Require(every_seconds > 0, ErrorCode::kInvalidArgument,
          "replica_sync_seconds must be positive, got " + Number(every_seconds));
  thread_ = std::thread([this] { Loop(); });
}

ReplicaSync::~ReplicaSync() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  group_.Cancel();
  wake_.notify_all();
  thread_.join();
  spdlog::info("replica {} of {}: the shared LoRA averaged over the replicas {} times ({} failed)", group_.rank(),
               group_.size(), synchronisations_.load(), failures_.load());
}

void ReplicaSync::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, std::chrono::duration<double>(every_seconds_), [this] { return stop_; });
    if (stop_) return;
    lock.unlock();
    SynchronizeNow();
    lock.lock();
  }
}

bool ReplicaSync::SynchronizeNow() {
  std::lock_guard<std::mutex> one_at_a_time(sync_mutex_);
  try {
    if (reform_) {
      group_.Reform();
      reform_ = false;
    }
    std::vector<torch::Tensor> copied;  // fp32 CPU copies of the shared LoRA as it was
    server_.WithSharedLora([&](const std::vector<torch::Tensor>& values) {
      for (const auto& v : values) copied.push_back(v.to(torch::kCPU, torch::kFloat32).contiguous().clone());
    });
    std::vector<torch::Tensor> means;
    for (const auto& c : copied) means.push_back(c.clone());
    group_.AverageInPlace(means);
    server_.WithSharedLora([&](const std::vector<torch::Tensor>& values) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < values.size(); ++i) {
        const torch::Tensor now = values[i].to(torch::kCPU, torch::kFloat32);
        values[i].copy_(means[i] + (now - copied[i]));  // mean exactly where no step ran meanwhile
      }
    });
    ++synchronisations_;
    return true;
  } catch (const Error& e) {
    ++failures_;
    reform_ = true;
    spdlog::warn("replica {}: the shared LoRA was not synchronised this time ({}); the replicas keep training apart "
                 "until the replica set forms again", group_.rank(), e.what());
    return false;
  }
}

}  // namespace amaq::server
