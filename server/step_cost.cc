#include "server/step_cost.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

namespace amaq::server {
namespace {

constexpr double kFloat = 4;  // bytes of an fp32 value

int64_t HeadDim(const ModelConfig& c) { return c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads; }
int64_t KvHeads(const ModelConfig& c) { return c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads; }

}  // namespace

uint64_t DecodeCacheBytes(const ModelConfig& c, int64_t server_layers, int64_t rows, int64_t tokens) {
  return static_cast<uint64_t>(2.0 * server_layers * rows * tokens * KvHeads(c) * HeadDim(c) * kFloat);
}

StepCost EstimateStepCost(const ModelConfig& c, int64_t server_layers, int64_t lora_rank, const StepInput& in,
                          int64_t cached_tokens) {
  const double rows = static_cast<double>(in.batch), tokens = static_cast<double>(in.tokens);
  const double n = rows * tokens;
  const double keys = tokens + static_cast<double>(cached_tokens);
  const double h = static_cast<double>(c.hidden_size), inter = static_cast<double>(c.intermediate_size);
  const double heads = static_cast<double>(c.num_attention_heads);
  const double q = heads * static_cast<double>(HeadDim(c)), kv = static_cast<double>(KvHeads(c) * HeadDim(c));
  const double layers = static_cast<double>(server_layers);
  // The positions the head runs on (NEXT_TOKEN: the last of each row; SCORE: at most one per
  // target), and how many of them are held at once (SCORE: kHeadRowsAtOnce, evaluate.h).
  double head_rows = rows, held_head_rows = rows;
  if (in.kind == StepKind::kTrain) {
    head_rows = held_head_rows =
        static_cast<double>(std::count_if(in.labels.begin(), in.labels.end(), [](int32_t l) { return l != -100; }));
  } else if (in.kind == StepKind::kScore) {
    head_rows = static_cast<double>(in.targets.positions.size());
    held_head_rows = std::min(head_rows, static_cast<double>(kHeadRowsAtOnce));
  }
  const double per_token_layer = 8 * h + 4 * inter + 14 * static_cast<double>(lora_rank);
  const double layer_bytes = n * per_token_layer * kFloat + 3 * rows * heads * tokens * keys * kFloat;
  const double head_bytes = held_head_rows * static_cast<double>(c.vocab_size) * kFloat;
  const double forward_flops = layers * (2 * n * (h * q + 2 * h * kv + q * h + 3 * h * inter) + 4 * rows * tokens * keys * q) +
                               2 * head_rows * h * static_cast<double>(c.vocab_size);
  StepCost cost;
  if (in.kind == StepKind::kTrain) {
    // Saved for the backward pass: every layer's activations; then the gradient at the cut.
    cost.bytes = static_cast<uint64_t>(3 * n * h * kFloat + layers * layer_bytes + 3 * head_bytes);
    cost.flops = 3 * forward_flops;
  } else {
    if (in.cache != DecodeCache::kNone) cost.kept_bytes = DecodeCacheBytes(c, server_layers, in.batch, static_cast<int64_t>(keys));
    cost.bytes = static_cast<uint64_t>(2 * n * h * kFloat + layer_bytes + 2 * head_bytes);
    cost.flops = forward_flops;
  }
  return cost;
}

uint64_t DeviceMemoryBytes(bool cuda, int device_index) {
  if (cuda) {
    const std::string command =
        "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i " + std::to_string(device_index) + " 2>/dev/null";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
    unsigned long long mib = 0;
    if (pipe && std::fscanf(pipe.get(), "%llu", &mib) == 1) return static_cast<uint64_t>(mib) << 20;
    return 0;
  }
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t limit = 0;
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");  // "max" when unlimited: not a number
  if (cgroup >> limit && limit > 0) return std::min(limit, physical);
  return physical;
}

}  // namespace amaq::server
