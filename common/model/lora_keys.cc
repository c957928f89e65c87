#include "common/model/lora_keys.h"

#include <sstream>

#include "common/base/error.h"

namespace amaq {

void AddLoraKeys(Config& config, const LoraConfig& defaults) {
  config.AddInt("lora_rank", defaults.rank, "LoRA rank r", 1, 4096);
  config.AddDouble("lora_alpha", defaults.alpha, "LoRA alpha (scaling alpha / r)", 1e-6, 1e6);
  config.AddDouble("lora_dropout", defaults.dropout, "LoRA dropout", 0, 0.99);
  std::string targets;
  for (const std::string& t : defaults.target_modules) targets += (targets.empty() ? "" : ",") + t;
  config.AddString("lora_targets", targets, "comma-separated PEFT target_modules");
}

LoraConfig LoraFromConfig(const Config& config) {
  LoraConfig lora;
  lora.rank = config.Int("lora_rank");
  lora.alpha = config.Double("lora_alpha");
  lora.dropout = config.Double("lora_dropout");
  lora.target_modules.clear();
  std::stringstream targets(config.String("lora_targets"));
  for (std::string t; std::getline(targets, t, ',');) {
    if (!t.empty()) lora.target_modules.push_back(t);
  }
  try {
    lora.Validate();
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("config: ") + e.what());
  }
  return lora;
}

}  // namespace amaq
