// Hugging Face model directories and PEFT adapters.
//
// A model directory holds config.json and the weights as model.safetensors, or as shards listed
// by model.safetensors.index.json ({"weight_map": {tensor: file}}). LoadPartWeights reads only the
// tensors of the layers a part runs (a client never maps the server's layers). SaveModel writes a
// directory that transformers' from_pretrained loads; SavePeftAdapter writes adapter_config.json +
// adapter_model.safetensors under PEFT's key names (base_model.model.<name>.lora_A.weight).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "common/model/lora.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"

namespace amaq {

class CheckpointReader {
 public:
  // Throws amaq::Error (kNotFound) when the directory has neither model.safetensors nor an index.
  static CheckpointReader Open(const std::string& dir);
  bool Has(const std::string& name) const { return file_of_.count(name) != 0; }
  // Loads `name` as `dtype`, checking its shape; errors name the file and the tensor.
  torch::Tensor Load(const std::string& name, const std::vector<int64_t>& shape, torch::Dtype dtype) const;

 private:
  const SafetensorsFile& File(const std::string& file) const;
  std::string dir_;
  std::map<std::string, std::string> file_of_;  // tensor -> file name within dir_
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> open_;
};

// Sets the part's base weights from the directory, one tensor at a time (ModelPart::BaseTensors),
// so that a compact part's peak memory is its compact size plus one dense tensor.
void LoadPartWeights(ModelPart& part, const std::string& dir);

// Writes config.json and model.safetensors for a whole model (a part with embedding and head).
void SaveModel(ModelPart& whole, const std::string& dir, torch::Dtype dtype = torch::kFloat);

// Writes the LoRA weights of `parts` (e.g. a client's and a server's) as one PEFT adapter.
void SavePeftAdapter(const std::vector<ModelPart*>& parts, const LoraConfig& lora,
                     const std::string& base_model, const std::string& dir);
// The same from LoRA tensors under PEFT's names without the prefix (ModelPart::LoraParameters).
void SaveLoraAsPeftAdapter(const NamedTensors& lora_weights, const LoraConfig& lora, const std::string& base_model,
                     const std::string& dir);
// The LoRA settings of an adapter directory's adapter_config.json (r, lora_alpha, lora_dropout,
// target_modules). Throws amaq::Error (kNotFound, kDataLoss) naming the file and the field.
LoraConfig ReadPeftAdapterConfig(const std::string& dir);
// The whole model of `model_dir` (fp32) with the PEFT adapter in `adapter_dir` merged into its
// base; `covered` is how many of the model's `lora_tensors` LoRA tensors the adapter held (fewer:
// an adapter of some layers only, the others run as the base).
struct MergedModel {
  ModelPart model{nullptr};
  int covered = 0;
  int lora_tensors = 0;
};
MergedModel LoadMergedModel(const std::string& model_dir, const std::string& adapter_dir);
// Copies the tokenizer files of model directory `from` (those present of tokenizer.json,
// tokenizer.model, tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt) to `to`.
void CopyTokenizerFiles(const std::string& from, const std::string& to);
// XXH3 (hex) of config.json, the safetensors headers (tensor names, dtypes, shapes, offsets), the
// cut layer and the base-weight format: client and server compare it to know they hold the same
// base model, held alike, split at the same layer. It reads headers only, never the weights.
std::string ModelFingerprint(const std::string& dir, int64_t cut_layer, BaseWeights base_weights = BaseWeights::kFp32);

// Reads an adapter written by SavePeftAdapter (or PEFT) into the matching LoRA weights of `part`;
// tensors of layers the part does not hold are skipped. Returns how many tensors were loaded.
int LoadPeftAdapter(ModelPart& part, const std::string& dir);

}  // namespace amaq
