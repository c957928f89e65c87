// A LLaMA-architecture GGUF file (general.architecture "llama", as llama.cpp's convert_hf_to_gguf
// writes it) as a Hugging Face model: its config from the `llama.*` metadata and its tensors under
// transformers' names, dequantized to fp32.
//
// llama.cpp stores the rows of q_proj and k_proj permuted for its rotary layout (within each head,
// the two halves of the rotated dimensions interleaved); GgufModelTensors undoes that, so the
// tensors are the ones transformers' LlamaForCausalLM holds. A file whose token embedding is also
// its output (no output.weight) is a model with tied embeddings.
//
// ConvertGgufToHf writes a directory every part of amaq reads (and transformers loads):
// config.json, model.safetensors (fp32) and, from `tokenizer.ggml.*`, tokenizer.json and
// tokenizer_config.json (with the chat template when the file has one); a file without a tokenizer
// gets none, with a warning.
#pragma once

#include <string>

#include "common/model/gguf.h"
#include "common/model/model.h"
#include "common/model/model_config.h"

namespace amaq {

// Throws amaq::Error (kDataLoss) naming the file and the key when a needed key is missing, and
// kInvalidArgument for an architecture other than llama.
ModelConfig GgufModelConfig(const GgufFile& file);

// Every tensor of the model, [out, in] as transformers holds them; q/k rows un-permuted.
NamedTensors GgufModelTensors(const GgufFile& file, const ModelConfig& config);

// Rows of a q_proj / k_proj weight [heads * head_dim, in] from llama.cpp's order back to
// transformers' (the inverse of convert_hf_to_gguf's LlamaModel.permute).
torch::Tensor UnpermuteRotaryRows(const torch::Tensor& weight, int64_t heads);

// Writes config.json, model.safetensors and the tokenizer files into `dir` (created).
void ConvertGgufToHf(const std::string& gguf_path, const std::string& dir);

}  // namespace amaq
