// StepCost: what a step will cost the server, estimated from its shape alone, before it is decoded
// or computed, so that a step too large for the device is refused up front (RESOURCE_EXHAUSTED,
// naming the limit) instead of discovered by exhausting memory while other clients wait.
//
// The estimate is meant as an upper bound, in fp32 (docs/reliability.md compares it with measured
// peaks): the decoded activation; for TRAIN every server layer's saved activations (8 x hidden +
// 4 x intermediate + the LoRA's rank-sized intermediates per token) and attention scores,
// probabilities and the softmax's temporary (3 x rows x heads x tokens x keys), then the logits of
// the labelled positions, their softmax and gradient; for SCORE and NEXT_TOKEN one layer's worth at
// a time and the logits (SCORE: of kHeadRowsAtOnce positions at a time). Compute counts the projections, attention and head, three times over for
// TRAIN (forward and backward).
#pragma once

#include <cstdint>
#include <string>

#include "common/base/split_step.h"
#include "common/model/model_config.h"

namespace amaq::server {

struct StepCost {
  uint64_t bytes = 0;       // while it computes
  uint64_t kept_bytes = 0;  // after it: the keys and values of a decoding cache (kStart, kExtend), cached tokens included
  double flops = 0;
};

// `server_layers` layers of `config` with LoRA of `lora_rank`; `cached_tokens`: the keys a
// decoding cache already holds for the step's rows (kExtend).
StepCost EstimateStepCost(const ModelConfig& config, int64_t server_layers, int64_t lora_rank, const StepInput& in,
                          int64_t cached_tokens);

// The bytes of the keys and values a decoding cache holds for `rows` x `tokens`.
uint64_t DecodeCacheBytes(const ModelConfig& config, int64_t server_layers, int64_t rows, int64_t tokens);

// The memory of the device steps run on: a CUDA device's (nvidia-smi; 0 when it cannot say), or
// the host's (the cgroup's memory.max when set, else physical memory).
uint64_t DeviceMemoryBytes(bool cuda, int device_index);

}  // namespace amaq::server
