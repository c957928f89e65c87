#include "common/model/lora_row_groups.h"

#include <map>
#include <string>
#include <utility>

#include "common/base/error.h"

namespace amaq {

LoraRowGroups::LoraRowGroups(ModelPart& part, std::vector<int64_t> row_starts,
                             const std::vector<const std::vector<torch::Tensor>*>& adapters) {
  Require(!part->recompute_layers(), ErrorCode::kInvalidArgument,
          "LoRA row groups on a part that recomputes its layers in backward: turn recompute_layers off");
  const std::vector<torch::Tensor> own = part->TrainableParameters();
  std::map<const void*, size_t> index;  // a LoRA tensor of the part -> its place in TrainableParameters()
  for (size_t i = 0; i < own.size(); ++i) index[own[i].unsafeGetTensorImpl()] = i;
  for (const std::vector<torch::Tensor>* adapter : adapters) {
    Require(adapter->size() == own.size(), ErrorCode::kInvalidArgument,
            "an adapter of " + std::to_string(adapter->size()) + " tensors for a part with " + std::to_string(own.size()) +
                " LoRA tensors: use the part's LoRA settings");
    for (size_t i = 0; i < own.size(); ++i) {
      Require((*adapter)[i].sizes() == own[i].sizes(), ErrorCode::kInvalidArgument,
              "an adapter's tensor " + std::to_string(i) + " has another shape than the part's: use the part's LoRA settings");
    }
  }
  for (auto& layer : part->layers) {
    for (auto& [path, linear] : layer->Projections()) {
      if (!linear->has_adapter()) continue;
      const size_t a = index.at(linear->lora_A->weight.unsafeGetTensorImpl());
      const size_t b = index.at(linear->lora_B->weight.unsafeGetTensorImpl());
      std::vector<std::pair<torch::Tensor, torch::Tensor>> weights;
      for (const std::vector<torch::Tensor>* adapter : adapters) weights.emplace_back((*adapter)[a], (*adapter)[b]);
      linear->SetRowGroups(row_starts, std::move(weights));
      grouped_.push_back(linear);
    }
  }
}

LoraRowGroups::~LoraRowGroups() {
  for (LoraLinear& linear : grouped_) linear->ClearRowGroups();
}

}  // namespace amaq
