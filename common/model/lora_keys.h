// The LoRA settings both programs share, as config keys: lora_rank, lora_alpha, lora_dropout and
// lora_targets (comma-separated PEFT module names).
#pragma once

#include "common/base/config.h"
#include "common/model/lora.h"

namespace amaq {

// Declares the keys with `defaults`' values as their defaults.
void AddLoraKeys(Config& config, const LoraConfig& defaults);
LoraConfig LoraFromConfig(const Config& config);  // throws amaq::Error naming the bad key

}  // namespace amaq
