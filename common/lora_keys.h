// The LoRA settings both programs share, as config keys: lora_rank, lora_alpha, lora_dropout and
// lora_targets (comma-separated PEFT module names).
#pragma once

#include "common/config.h"
#include "common/lora.h"

namespace amaq {

void AddLoraKeys(Config& config);
LoraConfig LoraFromConfig(const Config& config);  // throws amaq::Error naming the bad key

}  // namespace amaq
