#include "common/model/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>

#include "common/base/error.h"
#include "common/model/recompute.h"

namespace amaq {
namespace {

constexpr double kMaskedScore = -1e9;  // large and finite: fully masked rows stay NaN-free

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const Rotary& r) {
  return x * r.cos + RotateHalf(x) * r.sin;
}

// Inverse frequencies of the rotary embedding, with LLaMA-3 or linear scaling if configured.
torch::Tensor InverseFrequencies(const ModelConfig& c) {
  const int64_t d = c.head_dim;
  torch::Tensor inv = 1.0 / torch::pow(c.rope_theta, torch::arange(0, d, 2, torch::kDouble) / d);
  if (!c.rope_scaling) return inv.to(torch::kFloat);
  const RopeScaling& s = *c.rope_scaling;
  if (s.type == "linear") return (inv / s.factor).to(torch::kFloat);
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  const torch::Tensor wavelen = 2 * M_PI / inv;
  const torch::Tensor smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * inv / s.factor + smooth * inv;
  torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv / s.factor, inv);
  scaled = torch::where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), smoothed, scaled);
  return scaled.to(torch::kFloat);
}

// A [rows, cols] table drawn from N(0, 0.02) as `dtype`, in slices of rows, so that no fp32 copy
// of a whole bf16 table (the embedding: 32000 x 2048 at TinyLlama's shapes) is ever held.
torch::Tensor RandomTable(int64_t rows, int64_t cols, torch::Dtype dtype) {
  if (dtype == torch::kFloat) return torch::empty({rows, cols}).normal_(0, 0.02);
  torch::Tensor table = torch::empty({rows, cols}, dtype);
  constexpr int64_t kSliceRows = 1024;
  for (int64_t r = 0; r < rows; r += kSliceRows) {
    const int64_t n = std::min(kSliceRows, rows - r);
    table.narrow(0, r, n).copy_(torch::empty({n, cols}).normal_(0, 0.02));
  }
  return table;
}

// y = w * (x / rms(x)), computed in fp32 and returned in x's dtype. Its backward keeps x and
// 1 / rms(x) only, not the fp32 copy and the normalised x that autograd would keep for each of
// the two norms of every layer, and recomputes the rest:
//   dx = r * (gn - r^2 * x * mean(gn * x)),  gn = dy * w,  r = 1 / rms(x).
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               double eps) {
    const torch::Tensor x32 = x.to(torch::kFloat);
    const torch::Tensor r = torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
    ctx->save_for_backward({x, weight, r});
    return weight.to(x.scalar_type()) * (x32 * r).to(x.scalar_type());
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::tensor_list grads) {
    const torch::autograd::tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &r = saved[2];
    const torch::Tensor& dy = grads[0];
    const torch::Tensor x32 = x.to(torch::kFloat);
    torch::Tensor dweight;
    if (ctx->needs_input_grad(1)) {
      const torch::Tensor per_element = dy * (x32 * r).to(x.scalar_type());
      dweight = per_element.reshape({-1, x.size(-1)}).sum(0).to(weight.scalar_type());
    }
    const torch::Tensor gn = (dy * weight.to(dy.scalar_type())).to(torch::kFloat);
    const torch::Tensor dx = r * (gn - r.pow(2) * x32 * (gn * x32).mean(-1, /*keepdim=*/true));
    return {dx.to(x.scalar_type()), dweight, torch::Tensor()};
  }
};

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t size, double epsilon) : eps(epsilon) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return RmsNormFunction::apply(x, weight, eps); }

AttentionImpl::AttentionImpl(const ModelConfig& c, BaseWeights format)
    : heads(c.num_attention_heads), kv_heads(c.num_key_value_heads), head_dim(c.head_dim) {
  q_proj = register_module("q_proj", LoraLinear(c.hidden_size, heads * head_dim, c.attention_bias, format));
  k_proj = register_module("k_proj", LoraLinear(c.hidden_size, kv_heads * head_dim, c.attention_bias, format));
  v_proj = register_module("v_proj", LoraLinear(c.hidden_size, kv_heads * head_dim, c.attention_bias, format));
  o_proj = register_module("o_proj", LoraLinear(heads * head_dim, c.hidden_size, false, format));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const Rotary& rotary,
                                     const torch::Tensor& mask, LayerKv* cache) {
  const int64_t b = x.size(0), t = x.size(1);
  torch::Tensor q = q_proj(x).view({b, t, heads, head_dim}).transpose(1, 2);
  torch::Tensor k = k_proj(x).view({b, t, kv_heads, head_dim}).transpose(1, 2);
  torch::Tensor v = v_proj(x).view({b, t, kv_heads, head_dim}).transpose(1, 2);
  q = ApplyRotary(q, rotary);
  k = ApplyRotary(k, rotary);
  if (cache) {
    if (cache->keys.defined()) {
      k = torch::cat({cache->keys, k}, 2);
      v = torch::cat({cache->values, v}, 2);
    }
    cache->keys = k;
    cache->values = v;
  }
  if (kv_heads != heads) {  // grouped-query attention: each kv head serves heads / kv_heads queries
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  // Scores and softmax in fp32, or in bf16 when computing in bf16: its softmax still accumulates in
  // fp32 (LibTorch's kernels do), and the probabilities kept for backward take half the memory.
  // fp16 cannot hold the mask's -1e9, so it scores in fp32.
  const torch::Dtype score_dtype = q.scalar_type() == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat;
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)).to(score_dtype) /
                                   std::sqrt(static_cast<double>(head_dim)) +
                               mask.to(score_dtype);
  const torch::Tensor probs = torch::softmax(scores, -1).to(v.scalar_type());
  const torch::Tensor out = torch::matmul(probs, v).transpose(1, 2).reshape({b, t, heads * head_dim});
  return o_proj(out);
}

MlpImpl::MlpImpl(const ModelConfig& c, BaseWeights format) {
  gate_proj = register_module("gate_proj", LoraLinear(c.hidden_size, c.intermediate_size, false, format));
  up_proj = register_module("up_proj", LoraLinear(c.hidden_size, c.intermediate_size, false, format));
  down_proj = register_module("down_proj", LoraLinear(c.intermediate_size, c.hidden_size, false, format));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, BaseWeights format) {
  self_attn = register_module("self_attn", Attention(c, format));
  mlp = register_module("mlp", Mlp(c, format));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const Rotary& rotary,
                                        const torch::Tensor& mask, LayerKv* cache) {
  const torch::Tensor h = x + self_attn(input_layernorm(x), rotary, mask, cache);
  return h + mlp(post_attention_layernorm(h));
}

std::vector<std::pair<std::string, LoraLinear>> DecoderLayerImpl::Projections() {
  return {{"self_attn.q_proj", self_attn->q_proj}, {"self_attn.k_proj", self_attn->k_proj},
          {"self_attn.v_proj", self_attn->v_proj}, {"self_attn.o_proj", self_attn->o_proj},
          {"mlp.gate_proj", mlp->gate_proj},       {"mlp.up_proj", mlp->up_proj},
          {"mlp.down_proj", mlp->down_proj}};
}

ModelPartImpl::ModelPartImpl(const ModelConfig& config, PartSpec spec, BaseWeights format)
    : config_(config), spec_(spec), format_(format) {
  Require(spec.first_layer >= 0 && spec.first_layer <= spec.end_layer &&
              spec.end_layer <= config.num_hidden_layers,
          ErrorCode::kInvalidArgument,
          "layer range [" + std::to_string(spec.first_layer) + ", " + std::to_string(spec.end_layer) +
              ") lies outside the model's " + std::to_string(config.num_hidden_layers) +
              " layers: choose a split point in 0.." + std::to_string(config.num_hidden_layers));
  const bool compact = format != BaseWeights::kFp32;
  const auto random_table = [&](torch::Dtype dtype) { return RandomTable(config.vocab_size, config.hidden_size, dtype); };
  if (spec.embed && compact) {
    embed_frozen = FrozenWeight::Store(random_table(torch::kBFloat16), BaseWeights::kBf16);
  } else if (spec.embed) {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
    torch::NoGradGuard no_grad;
    embed_tokens->weight.normal_(0, 0.02);
  }
  for (int64_t i = spec.first_layer; i < spec.end_layer; ++i) {
    layers.push_back(register_module("layer" + std::to_string(i), DecoderLayer(config, format)));
  }
  if (spec.head) {
    norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
    const bool tied = spec.embed && config.tie_word_embeddings;
    if (compact) {
      head_frozen = tied ? embed_frozen
                         : std::shared_ptr<FrozenWeight>(FrozenWeight::Store(random_table(torch::kBFloat16), BaseWeights::kBf16));
    } else {
      lm_head = tied ? embed_tokens->weight : register_parameter("lm_head", random_table(torch::kFloat));
    }
  }
  inv_freq_ = register_buffer("inv_freq", InverseFrequencies(config));
}

Rotary ModelPartImpl::RotaryFor(const torch::Tensor& m, const torch::Tensor& same_segment,
                                 const torch::Tensor& future, torch::Dtype dtype) const {
  // Positions count context tokens only, so left- and right-padded batches agree with unpadded
  // ones; a candidate segment's tokens continue from the context before them (model.h).
  const torch::Tensor context = (m == 1).to(torch::kLong).cumsum(1);
  const torch::Tensor same_segment_before = (same_segment & future.t()).sum(2);  // earlier tokens of i's segment
  return RotaryAt(torch::where(m >= 2, context + same_segment_before, (context - 1).clamp_min(0)), dtype);
}

Rotary ModelPartImpl::RotaryAt(const torch::Tensor& positions, torch::Dtype dtype) const {
  const torch::Tensor angles = positions.unsqueeze(-1).to(torch::kFloat) * inv_freq_;  // [B, T, D/2]
  const torch::Tensor emb = torch::cat({angles, angles}, -1).unsqueeze(1);             // [B, 1, T, D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

torch::Tensor ModelPartImpl::Embed(const torch::Tensor& input) {
  if (spec_.embed) {
    Require(input.dim() == 2, ErrorCode::kInvalidArgument, "a part with the embedding takes token ids [batch, tokens]");
    return embed_frozen ? embed_frozen->Rows(input, compute_dtype_) : embed_tokens(input).to(compute_dtype_);
  }
  Require(input.dim() == 3 && input.size(2) == config_.hidden_size, ErrorCode::kInvalidArgument,
          "this part takes hidden states [batch, tokens, " + std::to_string(config_.hidden_size) + "]");
  return input;
}

torch::Tensor ModelPartImpl::Head(const torch::Tensor& x) {
  if (!spec_.head) return x;
  return head_frozen ? head_frozen->Linear(norm(x)) : torch::matmul(norm(x), lm_head.to(x.scalar_type()).t());
}

torch::Tensor ModelPartImpl::LogitsAtLabels(const torch::Tensor& input, const torch::Tensor& attention_mask,
                                             const torch::Tensor& labels) {
  return Head(AtLabels(Body(input, attention_mask), labels));
}

torch::Tensor ModelPartImpl::forward(const torch::Tensor& input, const torch::Tensor& attention_mask) {
  return Head(Body(input, attention_mask));
}

torch::Tensor ModelPartImpl::Body(const torch::Tensor& input, const torch::Tensor& attention_mask) {
  Require(attention_mask.dim() == 2 && attention_mask.size(0) == input.size(0) &&
              attention_mask.size(1) == input.size(1),
          ErrorCode::kInvalidArgument, "attention_mask must be [batch, tokens] like the input");
  torch::Tensor x = Embed(input);
  if (!layers.empty()) {
    // Token i sees token j <= i when j is context, or j is in i's own candidate segment.
    const int64_t t = x.size(1);
    const torch::Tensor m = attention_mask.to(x.device(), torch::kLong);
    const torch::Tensor future = torch::ones({t, t}, torch::kBool).triu(1).to(x.device());  // [i][j]: j > i
    const torch::Tensor same_segment = m.unsqueeze(2) == m.unsqueeze(1);                     // [B, i, j]
    const torch::Tensor seen = (m.unsqueeze(1) == 1) | (same_segment & (m.unsqueeze(1) >= 2));
    const torch::Tensor mask = torch::zeros({x.size(0), 1, t, t}, x.options().dtype(torch::kFloat))
                                   .masked_fill_(future | ~seen.unsqueeze(1), kMaskedScore);
    const Rotary rotary = RotaryFor(m, same_segment, future, x.scalar_type());
    const bool recompute = recompute_layers_ && torch::GradMode::is_enabled();
    for (auto& layer : layers) x = recompute ? ForwardRecomputed(*layer, x, rotary, mask) : layer(x, rotary, mask);
  }
  return x;
}

torch::Tensor ModelPartImpl::ForwardCached(const torch::Tensor& input, const torch::Tensor& attention_mask,
                                           KvCache& cache) {
  Require(attention_mask.dim() == 2 && attention_mask.size(0) == input.size(0) &&
              attention_mask.size(1) == input.size(1) && attention_mask.max().item<int64_t>() <= 1,
          ErrorCode::kInvalidArgument, "attention_mask must be [batch, tokens] of 1 (token) and 0 (padding)");
  Require(cache.length() == 0 || cache.seen.size(0) == input.size(0), ErrorCode::kInvalidArgument,
          "the cache holds " + std::to_string(cache.length() == 0 ? 0 : cache.seen.size(0)) + " sequences, the input " +
              std::to_string(input.size(0)) + ": start a new KvCache for another batch");
  torch::Tensor x = Embed(input);
  const int64_t t = x.size(1), past = cache.length();
  const torch::Tensor m = attention_mask.to(x.device(), torch::kLong);
  const torch::Tensor seen = past == 0 ? m : torch::cat({cache.seen, m}, 1);  // [B, past + t]
  // Positions count the tokens before, as forward() does: the tokens seen plus these, minus one.
  const torch::Tensor positions = (seen.cumsum(1) - 1).clamp_min(0).slice(1, past);
  // New token i sees key j when j is a token and j <= past + i.
  const torch::Tensor later = torch::ones({t, past + t}, torch::kBool).triu(past + 1).to(x.device());
  const torch::Tensor mask = torch::zeros({x.size(0), 1, t, past + t}, x.options().dtype(torch::kFloat))
                                 .masked_fill_(later | (seen == 0).unsqueeze(1).unsqueeze(1), kMaskedScore);
  const Rotary rotary = RotaryAt(positions, x.scalar_type());
  cache.layers.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i](x, rotary, mask, &cache.layers[i]);
  cache.seen = seen;
  return Head(x);
}

template <typename Fn>
void ModelPartImpl::ForEachLinear(Fn fn) {
  for (auto& layer : layers) {
    for (auto& [path, linear] : layer->Projections()) fn(path.substr(path.find('.') + 1), linear);
  }
}

std::vector<BaseTensor> ModelPartImpl::BaseTensors() {
  std::vector<BaseTensor> out;
  const auto dense = [&](const std::string& name, torch::Tensor t) {
    out.push_back({name, t.sizes().vec(), t.scalar_type(), [t] { return t; },
                   [t](const torch::Tensor& v) mutable { t.copy_(v); }});
  };
  const std::vector<int64_t> table = {config_.vocab_size, config_.hidden_size};
  const auto frozen = [&](const std::string& name, std::shared_ptr<FrozenWeight>& held, bool also_head) {
    out.push_back({name, table, torch::kBFloat16, [&held] { return held->Dense(torch::kFloat); },
                   [this, &held, also_head](const torch::Tensor& v) {
                     held = FrozenWeight::Store(v, BaseWeights::kBf16);
                     if (also_head) head_frozen = held;
                   }});
  };
  const bool tied_here = spec_.embed && spec_.head && config_.tie_word_embeddings;
  if (spec_.embed && embed_frozen) frozen("model.embed_tokens.weight", embed_frozen, tied_here);
  if (spec_.embed && !embed_frozen) dense("model.embed_tokens.weight", embed_tokens->weight);
  for (size_t j = 0; j < layers.size(); ++j) {
    const std::string prefix = "model.layers." + std::to_string(spec_.first_layer + static_cast<int64_t>(j)) + ".";
    for (const auto& p : layers[j]->named_parameters()) {
      if (p.key().find("lora_") == std::string::npos) dense(prefix + p.key(), p.value());
    }
    for (auto& [path, linear] : layers[j]->Projections()) {
      if (linear->format() == BaseWeights::kFp32) continue;  // listed above as a parameter
      LoraLinear held = linear;
      const torch::Dtype read_as = linear->format() == BaseWeights::kBf16 ? torch::kBFloat16 : torch::kFloat;
      out.push_back({prefix + path + ".weight", {held->out_features(), held->in_features()}, read_as,
                     [held] { return held->DenseWeight(torch::kFloat); },
                     [held](const torch::Tensor& v) mutable { held->SetBaseWeight(v); }});
    }
  }
  if (spec_.head) {
    dense("model.norm.weight", norm->weight);
    if (head_frozen && !tied_here) frozen("lm_head.weight", head_frozen, false);
    if (!head_frozen) dense("lm_head.weight", lm_head);
  }
  return out;
}

NamedTensors ModelPartImpl::HfParameters() {
  NamedTensors out;
  for (const BaseTensor& t : BaseTensors()) out.emplace_back(t.name, t.get());
  if (head_frozen && head_frozen == embed_frozen) out.emplace_back("lm_head.weight", head_frozen->Dense(torch::kFloat));
  return out;
}

NamedTensors ModelPartImpl::LoraParameters() {
  NamedTensors out;
  for (size_t j = 0; j < layers.size(); ++j) {
    const std::string prefix = "model.layers." + std::to_string(spec_.first_layer + static_cast<int64_t>(j)) + ".";
    for (const auto& p : layers[j]->named_parameters()) {
      if (p.key().find("lora_") != std::string::npos) out.emplace_back(prefix + p.key(), p.value());
    }
  }
  return out;
}

void ModelPartImpl::AddLora(const LoraConfig& lora, uint64_t seed) {
  lora.Validate();
  for (auto& p : parameters()) p.set_requires_grad(false);
  ForEachLinear([&](const std::string& name, LoraLinear& linear) {
    if (lora.Targets(name)) linear->AddAdapter(lora);
  });
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : LoraParameters()) {
    if (name.find("lora_A") == std::string::npos) continue;
    // PEFT's init, Kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    const double bound = 1.0 / std::sqrt(static_cast<double>(tensor.size(1)));
    auto generator = at::detail::createCPUGenerator(XXH3_64bits(name.data(), name.size()) ^ seed);
    const torch::Tensor init = torch::empty(tensor.sizes(), torch::kFloat).uniform_(-bound, bound, generator);
    tensor.copy_(init);
  }
}

void ModelPartImpl::MergeLora() {
  ForEachLinear([](const std::string&, LoraLinear& linear) { linear->Merge(); });
}

void ModelPartImpl::set_recompute_layers(bool recompute) {
  if (recompute) {
    ForEachLinear([](const std::string& name, LoraLinear& linear) {
      Require(!linear->has_adapter() || linear->dropout->options.p() == 0, ErrorCode::kInvalidArgument,
              "recomputed layers cannot use LoRA dropout (" + name + "): set lora_dropout 0 or turn recomputation off");
    });
  }
  recompute_layers_ = recompute;
}

int64_t ModelPartImpl::BaseWeightBytes() {
  int64_t bytes = 0;
  for (const auto& p : named_parameters()) {
    if (p.key().find("lora_") == std::string::npos) bytes += p.value().numel() * static_cast<int64_t>(p.value().element_size());
  }
  ForEachLinear([&](const std::string&, LoraLinear& linear) {
    if (linear->format() != BaseWeights::kFp32) bytes += linear->BaseWeightBytes();
  });
  if (embed_frozen) bytes += embed_frozen->StoredBytes();
  if (head_frozen && head_frozen != embed_frozen) bytes += head_frozen->StoredBytes();
  return bytes;
}

void ModelPartImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  compute_dtype_ = dtype;
  for (auto* held : {&embed_frozen, &head_frozen}) {
    if (*held) (*held)->To(device);
  }
}

void ModelPartImpl::set_compute_dtype(torch::Dtype dtype) {
  Require(dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf, ErrorCode::kInvalidArgument,
          "a part computes in fp32, bf16 or fp16: choose one of those");
  compute_dtype_ = dtype;
}

void ModelPartImpl::to(torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
  compute_dtype_ = dtype;
}

void ModelPartImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  for (auto* held : {&embed_frozen, &head_frozen}) {
    if (*held) (*held)->To(device);
  }
}

std::vector<torch::Tensor> ModelPartImpl::TrainableParameters() {
  std::vector<torch::Tensor> out;
  for (auto& p : parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

torch::Tensor AtLabels(const torch::Tensor& per_position, const torch::Tensor& labels) {
  return per_position.slice(1, 0, -1).index({labels.slice(1, 1).ne(-100).to(per_position.device())});
}

torch::Tensor NextTokenLoss(const torch::Tensor& labelled_logits, const torch::Tensor& labels) {
  const torch::Tensor next = labels.slice(1, 1);
  const torch::Tensor target = next.index({next.ne(-100)}).to(labelled_logits.device());
  return torch::nn::functional::cross_entropy(labelled_logits.to(torch::kFloat), target);
}

}  // namespace amaq
