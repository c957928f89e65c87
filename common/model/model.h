// A LLaMA-family decoder-only transformer in LibTorch, built as parts so that a model can be split
// between a client and a server at any layer (docs/model.md).
//
//   tokens -> embed_tokens -> layers[0..L) -> norm -> lm_head -> logits
//   layer:  x = x + o_proj(attention(rope(q_proj(rms(x))), rope(k_proj(..)), v_proj(..)))
//           x = x + down_proj(silu(gate_proj(rms(x))) * up_proj(rms(x)))
//
// A ModelPart holds a contiguous range of layers [first, end), optionally the embedding in front
// and the final norm and LM head behind. The whole model is the part [0, L) with both; the
// client of a split is [0, k) with the embedding, the server [k, L) with the head; in the U-shaped
// split the server holds [k, L) alone and the client keeps the head as a part [L, L). Parameter
// names follow Hugging Face (`model.layers.3.self_attn.q_proj.weight`), so checkpoints map 1:1.
// Attention: grouped-query, causal with key padding, optional q/k/v bias, rotary embeddings with
// LLaMA-3 or linear scaling; RMSNorm and softmax run in fp32 whatever the parameter dtype.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "common/model/lora.h"
#include "common/model/model_config.h"

namespace amaq {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// cos and sin of the rotary angles for given positions: [B, 1, T, head_dim] each.
struct Rotary {
  torch::Tensor cos, sin;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rotary, const torch::Tensor& mask);
  LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t heads, kv_heads, head_dim;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rotary, const torch::Tensor& mask);
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct PartSpec {
  int64_t first_layer = 0;
  int64_t end_layer = 0;
  bool embed = false;  // token ids in, embedding first
  bool head = false;   // final norm and lm_head last: logits out

  static PartSpec Whole(const ModelConfig& c) { return {0, c.num_hidden_layers, true, true}; }
  static PartSpec Client(int64_t cut) { return {0, cut, true, false}; }
  static PartSpec Server(const ModelConfig& c, int64_t cut) { return {cut, c.num_hidden_layers, false, true}; }
  static PartSpec ServerMiddle(const ModelConfig& c, int64_t cut) { return {cut, c.num_hidden_layers, false, false}; }
  static PartSpec ClientHead(const ModelConfig& c) { return {c.num_hidden_layers, c.num_hidden_layers, false, true}; }
};

class ModelPartImpl : public torch::nn::Module {
 public:
  // Throws amaq::Error (kInvalidArgument) when the layer range lies outside the model.
  ModelPartImpl(const ModelConfig& config, PartSpec spec);

  // input: token ids [B, T] (int64) when the part has the embedding, else hidden states [B, T, H].
  // attention_mask: [B, T], 1 for tokens, 0 for padding, and k >= 2 for the tokens of candidate
  // segment k: several continuations of one context packed in a row (evaluation). A token sees
  // the context tokens before it and the earlier tokens of its own segment; a segment's positions
  // continue from the context before it, so each segment computes exactly what the row
  // context + segment alone would. Returns logits [B, T, V] when the part has the head, else
  // hidden states [B, T, H].
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& attention_mask);

  // Base weights under their Hugging Face names (tied heads appear as lm_head.weight).
  NamedTensors HfParameters();
  // LoRA weights under PEFT's names without the "base_model.model." prefix.
  NamedTensors LoraParameters();
  // Adds LoRA adapters and freezes the base. Each A is drawn from a generator seeded by `seed`
  // and the parameter's name, so a whole model and its split parts start identical.
  void AddLora(const LoraConfig& lora, uint64_t seed = 0);
  void MergeLora();
  // Holds the seven projections' base weights of every layer as NF4 (LoraLinear::StoreAsNf4);
  // the embedding, norms and head stay as they are. Call after LoadPartWeights.
  void StoreProjectionsAsNf4(const quant::Nf4Options& options = {});
  // Parameters that require gradients (LoRA only, once AddLora was called).
  std::vector<torch::Tensor> TrainableParameters();

  const ModelConfig& config() const { return config_; }
  const PartSpec& spec() const { return spec_; }

  torch::nn::Embedding embed_tokens{nullptr};
  std::vector<DecoderLayer> layers;
  RMSNorm norm{nullptr};
  torch::Tensor lm_head;  // [V, H]; the embedding's weight when tied and both are here

 private:
  // Rotary angles for mask values m [B, T], given forward's same-segment [B, T, T] and future
  // [T, T] (j > i) masks.
  Rotary RotaryFor(const torch::Tensor& m, const torch::Tensor& same_segment, const torch::Tensor& future,
                   torch::Dtype dtype) const;
  template <typename Fn>
  void ForEachLinear(Fn fn);

  ModelConfig config_;
  PartSpec spec_;
  torch::Tensor inv_freq_;  // [head_dim / 2]
};
TORCH_MODULE(ModelPart);

// Mean next-token cross-entropy: logits [B, T, V] predict labels shifted by one; label -100 is
// ignored (padding, prompt tokens).
torch::Tensor NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace amaq
