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
// LLaMA-3 or linear scaling; RMSNorm runs in fp32 whatever the compute dtype, softmax in fp32
// (bf16 with fp32 accumulation when the part computes in bf16).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/base_weights.h"
#include "common/model/frozen_weight.h"
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

// Keys and values one attention layer has computed (after rotary, before grouped-query repeat):
// [B, kv_heads, T_seen, head_dim] each; undefined before the first token.
struct LayerKv {
  torch::Tensor keys, values;
};

// What a part has seen of a sequence, for incremental decoding (ModelPart::ForwardCached): each
// layer's keys and values and the mask of the tokens seen ([B, T_seen], 1 token, 0 padding).
// Starts empty; owned by the caller and valid for one part and one batch of sequences.
struct KvCache {
  std::vector<LayerKv> layers;
  torch::Tensor seen;
  int64_t length() const { return seen.defined() ? seen.size(1) : 0; }
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, BaseWeights format);
  // `cache` (may be null): keys and values of earlier tokens, extended by this call's; `mask` then
  // spans the cached tokens and these ([B, 1, t, T_seen + t]).
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rotary, const torch::Tensor& mask,
                        LayerKv* cache = nullptr);
  LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t heads, kv_heads, head_dim;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& config, BaseWeights format);
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& config, BaseWeights format);
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rotary, const torch::Tensor& mask,
                        LayerKv* cache = nullptr);
  // The seven projections under their paths within the layer ("self_attn.q_proj", ...).
  std::vector<std::pair<std::string, LoraLinear>> Projections();
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

// One frozen base tensor of a part: its Hugging Face name and shape, the dtype to read it in (the
// held one, or fp32 for what NF4 quantizes), its value as a dense tensor (a copy when held
// compact), and how to replace it (stored in the part's format). Valid while the part lives.
struct BaseTensor {
  std::string name;
  std::vector<int64_t> shape;
  torch::Dtype read_as;
  std::function<torch::Tensor()> get;
  std::function<void(const torch::Tensor&)> set;
};

class ModelPartImpl : public torch::nn::Module {
 public:
  // Base weights start random, held as `format` (base_weights.h) from the start, so a compact
  // part never holds its dense form. Throws amaq::Error (kInvalidArgument) when the layer range
  // lies outside the model.
  ModelPartImpl(const ModelConfig& config, PartSpec spec, BaseWeights format = BaseWeights::kFp32);

  // input: token ids [B, T] (int64) when the part has the embedding, else hidden states [B, T, H].
  // attention_mask: [B, T], 1 for tokens, 0 for padding, and k >= 2 for the tokens of candidate
  // segment k: several continuations of one context packed in a row (evaluation). A token sees
  // the context tokens before it and the earlier tokens of its own segment; a segment's positions
  // continue from the context before it, so each segment computes exactly what the row
  // context + segment alone would. Returns logits [B, T, V] when the part has the head, else
  // hidden states [B, T, H].
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& attention_mask);
  // forward() in two halves, Head(Body(input, mask)), for a caller that runs the head on some of
  // the positions only (those with a label: AtLabels) or on slices of the rows (a server computing
  // each client's loss in turn): Body is forward without the final norm and head, Head those two
  // alone over the last dimension of any shape (the identity when the part has no head).
  torch::Tensor Body(const torch::Tensor& input, const torch::Tensor& attention_mask);
  torch::Tensor Head(const torch::Tensor& x);
  // Head(AtLabels(Body(input, mask), labels)): the logits [N, V] at the positions whose next token
  // has a label, all that a loss or a label's score needs (NextTokenLoss, SequenceLogProbs).
  torch::Tensor LogitsAtLabels(const torch::Tensor& input, const torch::Tensor& attention_mask, const torch::Tensor& labels);
  // Incremental forward for decoding: `input` [B, t] continues the sequences `cache` holds (empty:
  // a prefill), attention_mask [B, t] is 1 for tokens and 0 for padding (no candidate segments),
  // and the cache grows by these t tokens. Row p of the output equals row T_seen + p of forward()
  // over everything seen so far, so a prompt may be left-padded and then extended token by token.
  torch::Tensor ForwardCached(const torch::Tensor& input, const torch::Tensor& attention_mask, KvCache& cache);

  // Base tensors under their Hugging Face names; a tied head appears as lm_head.weight when the
  // part holds it dense (the embedding's tensor), not when compact (it is the embedding's form).
  std::vector<BaseTensor> BaseTensors();
  // Base weights under their Hugging Face names as dense tensors (copies where held compact).
  NamedTensors HfParameters();
  // LoRA weights under PEFT's names without the "base_model.model." prefix.
  NamedTensors LoraParameters();
  // Adds LoRA adapters and freezes the base. Each A is drawn from a generator seeded by `seed`
  // and the parameter's name, so a whole model and its split parts start identical.
  void AddLora(const LoraConfig& lora, uint64_t seed = 0);
  void MergeLora();
  // Keeps only each layer's input during forward and recomputes the rest in backward
  // (activation checkpointing): same gradients, less memory, one more forward of the layers.
  // kInvalidArgument with LoRA dropout (its random mask would differ the second time).
  void set_recompute_layers(bool recompute);
  bool recompute_layers() const { return recompute_layers_; }
  // Parameters that require gradients (LoRA only, once AddLora was called).
  std::vector<torch::Tensor> TrainableParameters();

  const ModelConfig& config() const { return config_; }
  const PartSpec& spec() const { return spec_; }
  BaseWeights base_weights() const { return format_; }
  // The dtype activations are computed in: fp32 unless the part was cast with to(dtype) or set
  // here. set_compute_dtype leaves the parameters as they are and casts them at each use (QLoRA's
  // recipe: compact base, fp32 LoRA, bf16 activations); the outputs are then in `dtype`.
  // kInvalidArgument unless fp32, bf16 or fp16.
  torch::Dtype compute_dtype() const { return compute_dtype_; }
  void set_compute_dtype(torch::Dtype dtype);
  // The device the part's tensors are on.
  torch::Device device() const { return inv_freq_.device(); }
  // Bytes of the base weights as held (dense tensors and compact forms).
  int64_t BaseWeightBytes();

  // Module::to, and compact forms follow the device (never the dtype).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  // Dense (fp32): embed_tokens and lm_head. Compact: embed_frozen and head_frozen (bf16), one
  // object when the head is tied to an embedding this part holds.
  torch::nn::Embedding embed_tokens{nullptr};
  std::vector<DecoderLayer> layers;
  RMSNorm norm{nullptr};
  torch::Tensor lm_head;  // [V, H]; the embedding's weight when tied and both are here
  std::shared_ptr<FrozenWeight> embed_frozen, head_frozen;

 private:
  // Rotary angles for mask values m [B, T], given forward's same-segment [B, T, T] and future
  // [T, T] (j > i) masks.
  Rotary RotaryFor(const torch::Tensor& m, const torch::Tensor& same_segment, const torch::Tensor& future,
                   torch::Dtype dtype) const;
  Rotary RotaryAt(const torch::Tensor& positions, torch::Dtype dtype) const;  // positions [B, T]
  torch::Tensor Embed(const torch::Tensor& input);  // ids or hidden states in, hidden states out
  template <typename Fn>
  void ForEachLinear(Fn fn);

  ModelConfig config_;
  PartSpec spec_;
  BaseWeights format_;
  torch::Dtype compute_dtype_ = torch::kFloat;
  bool recompute_layers_ = false;
  torch::Tensor inv_freq_;  // [head_dim / 2]
};
TORCH_MODULE(ModelPart);

// The rows of `per_position` [B, T, ...] at the positions whose next token has a label (labels
// [B, T], -100 for none: padding, prompt tokens), [N, ...] in row-major order: the only positions
// a next-token loss or a label's score reads. Running the head on AtLabels(hidden, labels)
// rather than on every position gives the same loss at a fraction of the cost: the head is a small
// model's largest product (amaq-base's: 4096 x 256 weights per token, against 0.7 M in a layer),
// and a fine-tuning row labels only its answer.
torch::Tensor AtLabels(const torch::Tensor& per_position, const torch::Tensor& labels);
// Mean next-token cross-entropy of the logits at the labelled positions, AtLabels(logits, labels)
// [N, V], against those labels. NaN when no position has a label.
torch::Tensor NextTokenLoss(const torch::Tensor& labelled_logits, const torch::Tensor& labels);

}  // namespace amaq
