// The fine-tuned model in the user's hands: one PEFT adapter covering every layer of a split
// fine-tune, the client's LoRA (layers [0, cut)) and the server's (layers [cut, L), fetched with
// Transport::FetchAdapter), and optionally the base model with that adapter merged in, as a
// Hugging Face model directory with the base's tokenizer files.
#pragma once

#include <string>

#include "common/base/split_step.h"
#include "common/model/lora.h"
#include "common/model/model.h"

namespace amaq::client {

// Writes adapter_dir (adapter_config.json + adapter_model.safetensors) and, unless merged_dir is
// empty, merged_dir (config.json, model.safetensors, tokenizer files). Throws amaq::Error
// (kFailedPrecondition) when the server's LoRA settings differ from `lora` (one adapter_config
// states one rank, alpha and target set), and (kDataLoss) when the server's tensors are not the
// LoRA of layers [cut, L) under those settings. Nothing is written then.
void ExportWholeAdapter(ModelPart& client_part, const ServerAdapterInfo& server, const LoraConfig& lora,
                        const std::string& model_dir, const std::string& adapter_dir, const std::string& merged_dir);

// Writes `base` merged with the adapter in adapter_dir as a model directory at merged_dir.
void WriteMergedModel(const std::string& model_dir, const std::string& adapter_dir, const std::string& merged_dir);

}  // namespace amaq::client
