#include "common/model/checkpoint.h"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <fstream>

#include "common/base/atomic_file.h"
#include "common/base/error.h"

namespace amaq {
namespace {

constexpr char kPeftPrefix[] = "base_model.model.";

std::string Join(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

}  // namespace

CheckpointReader CheckpointReader::Open(const std::string& dir) {
  CheckpointReader reader;
  reader.dir_ = dir;
  const std::string index = Join(dir, "model.safetensors.index.json");
  const std::string single = Join(dir, "model.safetensors");
  if (std::filesystem::exists(index)) {
    std::ifstream in(index);
    nlohmann::json json;
    try {
      in >> json;
      for (const auto& [tensor, file] : json.at("weight_map").items()) {
        reader.file_of_[tensor] = file.get<std::string>();
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kDataLoss, index + ": not a valid safetensors index (" + e.what() + ")");
    }
  } else {
    Require(std::filesystem::exists(single), ErrorCode::kNotFound,
            dir + ": has neither model.safetensors nor model.safetensors.index.json: "
                  "point --model at a Hugging Face model directory");
    const SafetensorsFile& file = reader.File("model.safetensors");
    for (const std::string& name : file.Names()) reader.file_of_[name] = "model.safetensors";
  }
  return reader;
}

const SafetensorsFile& CheckpointReader::File(const std::string& file) const {
  auto it = open_.find(file);
  if (it == open_.end()) {
    it = open_.emplace(file, std::make_shared<SafetensorsFile>(SafetensorsFile::Open(Join(dir_, file)))).first;
  }
  return *it->second;
}

torch::Tensor CheckpointReader::Load(const std::string& name, const std::vector<int64_t>& shape,
                                     torch::Dtype dtype) const {
  const auto it = file_of_.find(name);
  Require(it != file_of_.end(), ErrorCode::kNotFound,
          dir_ + ": checkpoint has no tensor '" + name + "': it does not match config.json");
  return File(it->second).Load(name, dtype, &shape);
}

void LoadPartWeights(ModelPart& part, const std::string& dir) {
  const CheckpointReader reader = CheckpointReader::Open(dir);
  torch::NoGradGuard no_grad;
  for (const BaseTensor& t : part->BaseTensors()) {
    std::string stored = t.name;
    if (t.name == "lm_head.weight" && !reader.Has(t.name) && part->config().tie_word_embeddings) {
      stored = "model.embed_tokens.weight";  // tied checkpoints store the embedding only
    }
    // One tensor at a time: a compact part stores it and drops it before the next.
    t.set(reader.Load(stored, t.shape, t.read_as));
  }
}

void SaveModel(ModelPart& whole, const std::string& dir, torch::Dtype dtype) {
  const PartSpec& spec = whole->spec();
  const ModelConfig& config = whole->config();
  Require(spec.embed && spec.head && spec.first_layer == 0 && spec.end_layer == config.num_hidden_layers,
          ErrorCode::kInvalidArgument, "SaveModel writes whole models only");
  std::filesystem::create_directories(dir);
  NamedTensors tensors;
  for (auto& [name, tensor] : whole->HfParameters()) {
    if (name == "lm_head.weight" && config.tie_word_embeddings) continue;
    tensors.emplace_back(name, tensor);
  }
  WriteSafetensors(Join(dir, "model.safetensors"), tensors, dtype, {{"format", "pt"}});
  ModelConfig written = config;
  written.torch_dtype = dtype == torch::kBFloat16 ? "bfloat16" : dtype == torch::kHalf ? "float16" : "float32";
  WriteFileAtomically(Join(dir, "config.json"), written.ToJson().dump(2) + "\n");
}

void SavePeftAdapter(const std::vector<ModelPart*>& parts, const LoraConfig& lora,
                     const std::string& base_model, const std::string& dir) {
  NamedTensors weights;
  for (ModelPart* part : parts) {
    for (auto& named : (*part)->LoraParameters()) weights.push_back(named);
  }
  SaveLoraAsPeftAdapter(weights, lora, base_model, dir);
}

void SaveLoraAsPeftAdapter(const NamedTensors& lora_weights, const LoraConfig& lora, const std::string& base_model,
                     const std::string& dir) {
  std::filesystem::create_directories(dir);
  NamedTensors tensors;
  for (const auto& [name, tensor] : lora_weights) tensors.emplace_back(kPeftPrefix + name, tensor);
  Require(!tensors.empty(), ErrorCode::kFailedPrecondition, "no LoRA weights to export: add adapters first");
  WriteSafetensors(Join(dir, "adapter_model.safetensors"), tensors, torch::kFloat, {{"format", "pt"}});
  const nlohmann::json config = {
      {"peft_type", "LORA"},        {"task_type", "CAUSAL_LM"},
      {"r", lora.rank},             {"lora_alpha", lora.alpha},
      {"lora_dropout", lora.dropout}, {"target_modules", lora.target_modules},
      {"bias", "none"},             {"fan_in_fan_out", false},
      {"inference_mode", true},     {"init_lora_weights", true},
      {"modules_to_save", nullptr}, {"base_model_name_or_path", base_model},
      {"revision", nullptr},
  };
  WriteFileAtomically(Join(dir, "adapter_config.json"), config.dump(2) + "\n");
}

namespace {

// DIR/adapter_config.json, checked to be a JSON object.
nlohmann::json ReadAdapterConfigJson(const std::string& dir) {
  const std::string path = Join(dir, "adapter_config.json");
  Require(std::filesystem::exists(path), ErrorCode::kNotFound,
          path + " not found: give the directory of a PEFT adapter (adapter_config.json + adapter_model.safetensors)");
  std::ifstream in(path);
  nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  Require(json.is_object(), ErrorCode::kDataLoss, path + " is not a JSON object: export the adapter again");
  return json;
}

}  // namespace

LoraConfig ReadPeftAdapterConfig(const std::string& dir) {
  const std::string path = Join(dir, "adapter_config.json");
  const nlohmann::json json = ReadAdapterConfigJson(dir);
  LoraConfig lora;
  try {
    Require(json.value("peft_type", "LORA") == "LORA", ErrorCode::kInvalidArgument,
            path + ": peft_type " + json.value("peft_type", "") + " is not LORA: only LoRA adapters load");
    lora.rank = json.at("r").get<int64_t>();
    lora.alpha = json.at("lora_alpha").get<double>();
    lora.dropout = json.value("lora_dropout", 0.0);
    const nlohmann::json& targets = json.at("target_modules");
    lora.target_modules = targets.is_string() ? std::vector<std::string>{targets.get<std::string>()}
                                              : targets.get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kDataLoss, path + ": missing or mistyped field (" + std::string(e.what()) +
                                          "): it needs r, lora_alpha and target_modules; export the adapter again");
  }
  lora.Validate();
  return lora;
}

MergedModel LoadMergedModel(const std::string& model_dir, const std::string& adapter_dir) {
  const ModelConfig config = ModelConfig::Load(Join(model_dir, "config.json"));
  MergedModel merged;
  merged.model = ModelPart(config, PartSpec::Whole(config));
  LoadPartWeights(merged.model, model_dir);
  merged.model->AddLora(ReadPeftAdapterConfig(adapter_dir));
  merged.lora_tensors = static_cast<int>(merged.model->LoraParameters().size());
  merged.covered = LoadPeftAdapter(merged.model, adapter_dir);
  merged.model->MergeLora();
  return merged;
}

void CopyTokenizerFiles(const std::string& from, const std::string& to) {
  std::filesystem::create_directories(to);
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                           "vocab.json", "merges.txt"}) {
    const std::filesystem::path source = std::filesystem::path(from) / name;
    if (std::filesystem::exists(source)) {
      std::filesystem::copy_file(source, std::filesystem::path(to) / name, std::filesystem::copy_options::overwrite_existing);
    }
  }
}

std::string ModelFingerprint(const std::string& dir, int64_t cut_layer, BaseWeights base_weights) {
  const ModelConfig config = ModelConfig::Load(Join(dir, "config.json"));
  std::string material = config.ToJson().dump() + "\ncut=" + std::to_string(cut_layer) + "\n";
  // fp32 adds nothing, so that fingerprints from before storage formats existed still match.
  if (base_weights != BaseWeights::kFp32) material += "base_weights=" + ToString(base_weights) + "\n";
  const std::string index = Join(dir, "model.safetensors.index.json");
  std::vector<std::string> files;
  if (std::filesystem::exists(index)) {
    std::ifstream in(index);
    std::set<std::string> shards;
    for (const auto& [tensor, file] : nlohmann::json::parse(in).at("weight_map").items()) shards.insert(file.get<std::string>());
    files.assign(shards.begin(), shards.end());
  } else {
    files.push_back("model.safetensors");
  }
  for (const std::string& f : files) {
    const SafetensorsFile file = SafetensorsFile::Open(Join(dir, f));
    for (const std::string& name : file.Names()) {
      const TensorEntry& e = file.Entry(name);
      material += f + ":" + name + ":" + e.dtype + ":" + std::to_string(e.begin) + "-" + std::to_string(e.end) + "\n";
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(material.data(), material.size())));
  return hex;
}

int LoadPeftAdapter(ModelPart& part, const std::string& dir) {
  const SafetensorsFile file = SafetensorsFile::Open(Join(dir, "adapter_model.safetensors"));
  torch::NoGradGuard no_grad;
  int loaded = 0;
  for (auto& [name, tensor] : part->LoraParameters()) {
    const std::string key = kPeftPrefix + name;
    if (!file.Has(key)) continue;
    const std::vector<int64_t> shape = tensor.sizes().vec();
    const std::vector<int64_t>& stored = file.Entry(key).shape;
    if (stored != shape) {  // an adapter of another base model (or another rank than its config says)
      const nlohmann::json config = ReadAdapterConfigJson(dir);
      const std::string base = config.value("base_model_name_or_path", nlohmann::json()).is_string()
                                   ? config["base_model_name_or_path"].get<std::string>() : "(not named)";
      throw Error(ErrorCode::kInvalidArgument,
                  dir + " is an adapter of another model: its " + key + " has shape " + c10::str(c10::IntArrayRef(stored)) +
                      " where this model needs " + c10::str(c10::IntArrayRef(shape)) + "; its adapter_config.json names the base " +
                      base + ": give that model (--model)");
    }
    tensor.copy_(file.Load(key, tensor.scalar_type(), &shape));
    ++loaded;
  }
  return loaded;
}

}  // namespace amaq
