// Activation recomputation (gradient checkpointing, Chen et al. 2016) of one decoder layer: the
// forward runs without recording a graph and keeps only the layer's input; backward runs the
// layer's forward again with a graph and back-propagates through it, which accumulates the LoRA
// gradients and returns the input's. The same operations run in the same order, so gradients
// equal those of the stored-activation path. The layer must not draw random numbers (no LoRA
// dropout) and must outlive backward.
#pragma once

#include <torch/torch.h>

#include "common/model/model.h"

namespace amaq {

// layer(x, rotary, mask), keeping only x for backward. x takes part in the graph even when it
// does not require gradients itself (the embedding's output), so that the LoRA gradients of the
// layer are computed.
torch::Tensor ForwardRecomputed(DecoderLayerImpl& layer, const torch::Tensor& x, const Rotary& rotary,
                                const torch::Tensor& mask);

}  // namespace amaq
