#include "client/adapter_export.h"

#include <spdlog/spdlog.h>

#include "common/base/error.h"
#include "common/model/checkpoint.h"

namespace amaq::client {
namespace {

// The LoRA tensors of layers [cut, L) that `lora` gives, by name and shape. Every layer of a
// LLaMA-family model has the same shapes, so they come from one layer: the client's own first one,
// or (a client without layers, cut 0) a one-layer part; the server's half is never built here.
std::map<std::string, std::vector<int64_t>> ExpectedServerLora(ModelPart& client_part, const LoraConfig& lora) {
  const ModelConfig& config = client_part->config();
  const int64_t cut = client_part->spec().end_layer;
  ModelPart one = client_part;
  if (client_part->layers.empty()) {
    one = ModelPart(config, PartSpec{0, 1, false, false});
    one->AddLora(lora);
  }
  const std::string first = "model.layers." + std::to_string(one->spec().first_layer) + ".";
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : one->LoraParameters()) {
    if (name.rfind(first, 0) != 0) continue;
    for (int64_t layer = cut; layer < config.num_hidden_layers; ++layer) {
      shapes["model.layers." + std::to_string(layer) + "." + name.substr(first.size())] = tensor.sizes().vec();
    }
  }
  return shapes;
}

}  // namespace

void ExportWholeAdapter(ModelPart& client_part, const ServerAdapterInfo& server, const LoraConfig& lora,
                        const std::string& model_dir, const std::string& adapter_dir, const std::string& merged_dir) {
  Require(server.lora_rank == lora.rank && server.lora_alpha == lora.alpha && server.target_modules == lora.target_modules,
          ErrorCode::kFailedPrecondition,
          "the server's LoRA (rank " + std::to_string(server.lora_rank) + ", alpha " + std::to_string(server.lora_alpha) +
              ") differs from this client's (rank " + std::to_string(lora.rank) + ", alpha " + std::to_string(lora.alpha) +
              ") or targets other projections: one adapter states one setting; give both sides the same lora_* keys");
  const ModelConfig& config = client_part->config();
  const std::map<std::string, std::vector<int64_t>> expected = ExpectedServerLora(client_part, lora);
  Require(server.tensors.size() == expected.size(), ErrorCode::kDataLoss,
          "the server sent " + std::to_string(server.tensors.size()) + " LoRA tensors, layers [" +
              std::to_string(client_part->spec().end_layer) + ", " + std::to_string(config.num_hidden_layers) + ") hold " +
              std::to_string(expected.size()) + ": the server runs another cut or model; check both sides' settings");
  NamedTensors weights = client_part->LoraParameters();
  for (const auto& [name, tensor] : server.tensors) {
    const auto it = expected.find(name);
    Require(it != expected.end() && it->second == tensor.shape, ErrorCode::kDataLoss,
            "the server's LoRA tensor '" + Excerpt(name) + "' is not one of layers [cut, L) in this shape: check both sides' settings");
    weights.emplace_back(name, torch::tensor(tensor.values, torch::kFloat).reshape(tensor.shape));
  }
  SaveLoraAsPeftAdapter(weights, lora, model_dir, adapter_dir);
  spdlog::info("wrote the whole adapter ({} LoRA tensors: {} of this client, {} of the server{}) to {}", weights.size(),
               weights.size() - server.tensors.size(), server.tensors.size(), server.shared ? ", shared by every client" : "",
               adapter_dir);
  if (!merged_dir.empty()) WriteMergedModel(model_dir, adapter_dir, merged_dir);
}

void WriteMergedModel(const std::string& model_dir, const std::string& adapter_dir, const std::string& merged_dir) {
  ModelPart whole = LoadMergedModel(model_dir, adapter_dir).model;
  SaveModel(whole, merged_dir);
  CopyTokenizerFiles(model_dir, merged_dir);
  spdlog::info("wrote the base model with the adapter merged in to {}", merged_dir);
}

}  // namespace amaq::client
