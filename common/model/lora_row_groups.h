// LoraRowGroups: one forward of a ModelPart over the rows of several adapters (a server batching
// the steps of clients that each have their own LoRA). While the object lives, rows
// [row_starts[g], row_starts[g+1]) of every forward of the part use adapters[g] in place of the
// part's own LoRA, where adapters[g][i] stands in for part->TrainableParameters()[i]; gradients
// of a backward through such a forward reach the adapters' tensors. The part and the adapters'
// tensors must outlive the object. kInvalidArgument when the adapters do not match the part's
// LoRA tensors in number and shape, or when the part recomputes its layers in backward (by then
// the groups are gone).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "common/model/model.h"

namespace amaq {

class LoraRowGroups {
 public:
  LoraRowGroups(ModelPart& part, std::vector<int64_t> row_starts,
                const std::vector<const std::vector<torch::Tensor>*>& adapters);
  ~LoraRowGroups();
  LoraRowGroups(const LoraRowGroups&) = delete;
  LoraRowGroups& operator=(const LoraRowGroups&) = delete;

 private:
  std::vector<LoraLinear> grouped_;
};

}  // namespace amaq
