#include "common/model/evaluate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/base/error.h"
#include "common/model/decoders.h"

namespace amaq {
namespace {

// Pointers to examples [begin, begin + count), cut at the end.
std::vector<const Example*> Slice(const std::vector<Example>& examples, size_t begin, int64_t count) {
  std::vector<const Example*> out;
  for (size_t k = begin; k < std::min(examples.size(), begin + static_cast<size_t>(count)); ++k) out.push_back(&examples[k]);
  return out;
}

}  // namespace

torch::Tensor TargetLogProbs(const torch::Tensor& hidden, const std::function<torch::Tensor(const torch::Tensor&)>& head,
                             const ScoreTargets& targets) {
  const auto n = static_cast<int64_t>(targets.positions.size());
  const int64_t rows = hidden.size(0), tokens = hidden.size(1);
  Require(targets.count > 0 && n > 0 && static_cast<int64_t>(targets.tokens.size()) == n &&
              static_cast<int64_t>(targets.candidates.size()) == n,
          ErrorCode::kInvalidArgument, "score targets need at least one candidate and one position, token and candidate each");
  for (int64_t i = 0; i < n; ++i) {
    Require(targets.positions[i] >= 0 && targets.positions[i] < rows * tokens && targets.candidates[i] >= 0 &&
                targets.candidates[i] < targets.count,
            ErrorCode::kInvalidArgument, "score target " + std::to_string(i) + " lies outside the batch's positions or candidates");
  }
  const auto as_tensor = [&](const std::vector<int32_t>& v) {
    return torch::from_blob(const_cast<int32_t*>(v.data()), {n}, torch::kInt).to(hidden.device(), torch::kLong);
  };
  const torch::Tensor position = as_tensor(targets.positions), token = as_tensor(targets.tokens);
  const auto [distinct, which, counts] = at::_unique2(position, /*sorted=*/true, /*return_inverse=*/true);
  const torch::Tensor flat = hidden.reshape({rows * tokens, hidden.size(2)});
  torch::Tensor picked = torch::empty({n}, hidden.options().dtype(torch::kFloat));
  for (int64_t u = 0; u < distinct.size(0); u += kHeadRowsAtOnce) {
    const int64_t end = std::min(u + kHeadRowsAtOnce, distinct.size(0));
    const torch::Tensor logits = head(flat.index_select(0, distinct.slice(0, u, end))).to(torch::kFloat);  // [c, V]
    const torch::Tensor normalizer = logits.logsumexp(-1);
    const torch::Tensor mine = ((which >= u) & (which < end)).nonzero().select(1, 0);  // the targets read here
    const torch::Tensor local = which.index_select(0, mine) - u;
    picked.index_put_({mine}, logits.index({local, token.index_select(0, mine)}) - normalizer.index_select(0, local));
  }
  const torch::Tensor row = torch::div(position, tokens, "floor");
  return torch::zeros({rows, targets.count}, picked.options())
      .index_put_({row, as_tensor(targets.candidates)}, picked, /*accumulate=*/true);
}

torch::Tensor SequenceLogProbs(const torch::Tensor& labelled_logits, const torch::Tensor& labels) {
  const torch::Tensor next = labels.slice(1, 1);
  const torch::Tensor labelled = next.ne(-100);
  const torch::Tensor target = next.index({labelled}).to(labelled_logits.device());
  const torch::Tensor picked =
      torch::log_softmax(labelled_logits.to(torch::kFloat), -1).gather(-1, target.unsqueeze(-1)).squeeze(-1);  // [N]
  const torch::Tensor row = labelled.nonzero().select(1, 0).to(picked.device());
  return torch::zeros({labels.size(0), 1}, picked.options()).index_add_(0, row, picked.unsqueeze(1));
}

torch::Tensor LastTokenArgmax(const torch::Tensor& logits, const torch::Tensor& mask) {
  const torch::Tensor last = mask.sum(1) - 1;  // right padding: the last real position
  const torch::Tensor rows = torch::arange(logits.size(0), torch::kLong);
  return logits.index({rows, last}).argmax(-1);
}

torch::Tensor LastColumnArgmax(const torch::Tensor& logits) { return logits.select(1, logits.size(1) - 1).argmax(-1); }

double ClassificationAccuracy(const CandidateScorer& score, const ExampleEncoder& encoder,
                              const Dataset& dataset, const std::vector<Example>& examples,
                              int64_t batch_size, int64_t max_row_tokens, std::vector<std::string>* predicted) {
  Require(dataset.is_classification(), ErrorCode::kInvalidArgument,
          dataset.name + " is not a classification data set: use exact match");
  if (predicted) predicted->assign(examples.size(), "");
  if (examples.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  const std::vector<std::vector<std::string>> groups = encoder.CandidateGroups(dataset.labels, max_row_tokens);
  // Rows of similar length go together, so that a batch is padded little.
  std::vector<int64_t> length;
  for (const Example& e : examples) length.push_back(encoder.PromptTokens(e.prompt));
  std::vector<size_t> order(examples.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length[a] < length[b]; });
  int64_t correct = 0;
  for (size_t i = 0; i < examples.size(); i += static_cast<size_t>(batch_size)) {
    std::vector<const Example*> chunk;
    for (size_t k = i; k < std::min(examples.size(), i + static_cast<size_t>(batch_size)); ++k) chunk.push_back(&examples[order[k]]);
    std::vector<torch::Tensor> parts;
    for (const std::vector<std::string>& group : groups) {
      const torch::Tensor part = score(encoder.MakeCandidateBatch(chunk, group));
      Require(part.dim() == 2 && part.size(0) == static_cast<int64_t>(chunk.size()) &&
                  part.size(1) == static_cast<int64_t>(group.size()),
              ErrorCode::kDataLoss, "the scorer returned " + std::to_string(part.numel()) + " scores for " +
                                        std::to_string(chunk.size()) + " examples of " + std::to_string(group.size()) +
                                        " labels: the server and this client disagree; update both");
      parts.push_back(part);
    }
    const torch::Tensor best = torch::cat(parts, 1).argmax(1);
    for (size_t e = 0; e < chunk.size(); ++e) {
      const int64_t label = best[static_cast<int64_t>(e)].item<int64_t>();
      correct += label == chunk[e]->label;
      if (predicted) (*predicted)[order[i + e]] = dataset.labels[static_cast<size_t>(label)];
    }
  }
  return static_cast<double>(correct) / static_cast<double>(examples.size());
}

double ExactMatch(GreedyDecoder& decoder, const ExampleEncoder& encoder, const std::vector<Example>& examples,
                  int64_t max_new_tokens, int64_t batch_size, std::vector<std::string>* predicted) {
  if (predicted) predicted->clear();
  if (examples.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  for (size_t i = 0; i < examples.size(); i += static_cast<size_t>(batch_size)) {
    const std::vector<const Example*> chunk = Slice(examples, i, batch_size);
    const Batch b = encoder.MakeBatch(chunk, std::vector<uint64_t>(chunk.size(), 0), /*with_completion=*/false);
    std::vector<std::vector<int64_t>> generated(chunk.size());
    std::vector<bool> done(chunk.size(), false);
    torch::Tensor next = decoder.Start(b.ids, b.mask);
    for (int64_t t = 0; t < max_new_tokens; ++t) {
      if (t > 0) next = decoder.Next(next);
      bool all_done = true;
      for (size_t r = 0; r < chunk.size(); ++r) {
        const int64_t token = next[static_cast<int64_t>(r)].item<int64_t>();
        if (!done[r]) {
          if (token == encoder.eos_id()) {
            done[r] = true;
          } else {
            generated[r].push_back(token);
          }
        }
        all_done = all_done && done[r];
      }
      if (all_done) break;
    }
    for (size_t r = 0; r < chunk.size(); ++r) {
      std::string text = encoder.tokenizer().Decode(generated[r]);
      const size_t b0 = text.find_first_not_of(' ');
      text = b0 == std::string::npos ? "" : text.substr(b0);
      correct += text == chunk[r]->completion;
      if (predicted) predicted->push_back(text);
    }
  }
  return static_cast<double>(correct) / static_cast<double>(examples.size());
}

double Perplexity(const SequenceScorer& score, const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  double log_likelihood = 0, tokens = 0;
  for (const Batch& b : batches) {
    log_likelihood += score(b).sum().item<double>();
    tokens += (b.labels.slice(1, 1) != -100).sum().item<double>();
  }
  Require(tokens > 0, ErrorCode::kInvalidArgument, "perplexity needs at least one labelled token");
  return std::exp(-log_likelihood / tokens);
}

}  // namespace amaq
