#include "common/model/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "common/base/error.h"
#include "common/model/decoders.h"

namespace amaq {
namespace {

// Where the first stop string begins in `text` (npos: none).
size_t FirstStop(const std::string& text, const std::vector<std::string>& stop) {
  size_t first = std::string::npos;
  for (const std::string& s : stop) first = std::min(first, text.find(s));
  return first;
}

}  // namespace

Generation Generate(ModelPart& model, const Tokenizer& tokenizer, const std::string& prompt,
                    const GenerationOptions& o, const std::function<void(const std::string&)>& on_text) {
  o.sampling.Validate();
  Require(o.max_new_tokens >= 1, ErrorCode::kInvalidArgument,
          "max_new_tokens " + std::to_string(o.max_new_tokens) + " must be >= 1");
  for (const std::string& s : o.stop) Require(!s.empty(), ErrorCode::kInvalidArgument, "a stop string is empty: drop it");
  const ModelConfig& c = model->config();
  std::vector<int64_t> ids;
  if (o.bos) ids.push_back(c.bos_token_id);
  for (const int64_t id : tokenizer.Encode(prompt)) ids.push_back(id);
  Require(!ids.empty(), ErrorCode::kInvalidArgument, "the prompt encodes to no tokens: give some text");
  const int64_t room = c.max_position_embeddings - static_cast<int64_t>(ids.size());
  Require(room >= 1, ErrorCode::kInvalidArgument,
          "the prompt is " + std::to_string(ids.size()) + " tokens; the model has " +
              std::to_string(c.max_position_embeddings) + " positions: shorten the prompt");
  const int64_t max_new = std::min(o.max_new_tokens, room);
  at::Generator generator = at::detail::createCPUGenerator(o.seed);
  CachedDecoder decoder(model);
  const torch::Tensor prompt_ids = torch::tensor(ids, torch::kLong).unsqueeze(0);
  const auto last = [](const torch::Tensor& logits) { return logits.select(1, logits.size(1) - 1).to(torch::kCPU, torch::kFloat); };
  torch::Tensor logits = last(decoder.Prefill(prompt_ids, torch::ones_like(prompt_ids)).first);
  size_t hold = 0;  // text not shown yet because a stop string may begin there
  for (const std::string& s : o.stop) hold = std::max(hold, s.size() - 1);
  Generation g;
  std::string shown;
  const auto show = [&](const std::string& text, size_t upto) {
    if (!on_text || upto <= shown.size() || text.compare(0, shown.size(), shown) != 0) return;
    on_text(text.substr(shown.size(), upto - shown.size()));
    shown = text.substr(0, upto);
  };
  for (int64_t t = 0; t < max_new; ++t) {
    const int64_t token = SampleTokens(logits, o.sampling, generator)[0].item<int64_t>();
    if (token == c.eos_token_id) {
      g.finish = "eos";
      break;
    }
    g.tokens.push_back(token);
    g.text = tokenizer.Decode(g.tokens);
    const size_t stop_at = FirstStop(g.text, o.stop);
    if (stop_at != std::string::npos) {
      g.text.resize(stop_at);
      g.finish = "stop";
      break;
    }
    show(g.text, g.text.size() > hold ? g.text.size() - hold : 0);
    if (t + 1 < max_new) logits = last(decoder.Extend(torch::tensor({token}, torch::kLong)));
  }
  if (g.finish.empty()) g.finish = "length";
  show(g.text, g.text.size());
  return g;
}

}  // namespace amaq
