#include "common/model/batching.h"

#include <algorithm>

#include "common/base/error.h"

namespace amaq {
namespace {

// Rows of ids, mask values and labels, right-padded to `tokens` (id 0, mask 0, label -100).
Batch RightPadded(const std::vector<std::vector<int64_t>>& rows, const std::vector<std::vector<int64_t>>& masks,
                  const std::vector<std::vector<int64_t>>& targets, int64_t tokens, std::vector<uint64_t> sample_ids) {
  const auto b = static_cast<int64_t>(rows.size());
  Batch batch{torch::zeros({b, tokens}, torch::kLong), torch::zeros({b, tokens}, torch::kLong),
              torch::full({b, tokens}, -100, torch::kLong), std::move(sample_ids)};
  auto ids = batch.ids.accessor<int64_t, 2>();
  auto mask = batch.mask.accessor<int64_t, 2>();
  auto labels = batch.labels.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) {
      ids[i][static_cast<int64_t>(j)] = rows[i][j];
      mask[i][static_cast<int64_t>(j)] = masks[i][j];
      labels[i][static_cast<int64_t>(j)] = targets[i][j];
    }
  }
  return batch;
}

}  // namespace

ExampleEncoder::ExampleEncoder(const Tokenizer& tokenizer, int64_t bos_id, int64_t eos_id, int64_t max_tokens)
    : tokenizer_(tokenizer), bos_(bos_id), eos_(eos_id), max_tokens_(max_tokens) {
  Require(max_tokens >= 4, ErrorCode::kInvalidArgument, "max_tokens must be at least 4");
}

ExampleEncoder::Pair ExampleEncoder::Encode(const std::string& prompt, const std::string& completion) const {
  Pair pair;
  pair.prompt = tokenizer_.Encode(prompt);
  const std::vector<int64_t> full = tokenizer_.Encode(prompt + " " + completion);
  if (full.size() > pair.prompt.size() && std::equal(pair.prompt.begin(), pair.prompt.end(), full.begin())) {
    pair.completion.assign(full.begin() + static_cast<long>(pair.prompt.size()), full.end());
  } else {
    pair.completion = tokenizer_.Encode(" " + completion);  // a merge crossed the boundary
  }
  return pair;
}

Batch ExampleEncoder::MakeBatch(const std::vector<const Example*>& examples,
                                const std::vector<uint64_t>& sample_ids, bool with_completion, int64_t pad_to) const {
  Require(examples.size() == sample_ids.size() && !examples.empty(), ErrorCode::kInvalidArgument,
          "a batch needs one sample id per example and at least one example");
  std::vector<std::vector<int64_t>> rows, targets;
  size_t longest = 0;
  for (const Example* e : examples) {
    const Pair pair = Encode(e->prompt, e->completion);
    std::vector<int64_t> row = {bos_};
    row.insert(row.end(), pair.prompt.begin(), pair.prompt.end());
    std::vector<int64_t> target(row.size(), -100);
    if (with_completion) {
      row.insert(row.end(), pair.completion.begin(), pair.completion.end());
      row.push_back(eos_);
      target.insert(target.end(), pair.completion.begin(), pair.completion.end());
      target.push_back(eos_);
    }
    if (static_cast<int64_t>(row.size()) > max_tokens_) {
      // Keep the end (the completion) and cut the prompt's beginning after BOS.
      const size_t drop = row.size() - static_cast<size_t>(max_tokens_);
      row.erase(row.begin() + 1, row.begin() + 1 + static_cast<long>(drop));
      target.erase(target.begin() + 1, target.begin() + 1 + static_cast<long>(drop));
    }
    longest = std::max(longest, row.size());
    rows.push_back(std::move(row));
    targets.push_back(std::move(target));
  }
  std::vector<std::vector<int64_t>> masks;
  for (const auto& row : rows) masks.emplace_back(row.size(), 1);
  const int64_t t = std::max(static_cast<int64_t>(longest), std::min(pad_to, max_tokens_));
  return RightPadded(rows, masks, targets, t, sample_ids);
}

Batch ExampleEncoder::MakeCandidateBatch(const std::vector<const Example*>& examples,
                                         const std::vector<std::string>& candidates) const {
  Require(!examples.empty() && !candidates.empty(), ErrorCode::kInvalidArgument,
          "a candidate batch needs at least one example and one candidate");
  std::vector<std::vector<int64_t>> rows, masks, targets;
  size_t longest = 0;
  for (const Example* e : examples) {
    std::vector<Pair> pairs;
    size_t longest_completion = 0;
    for (const std::string& c : candidates) {
      pairs.push_back(Encode(e->prompt, c));
      longest_completion = std::max(longest_completion, pairs.back().completion.size());
    }
    std::vector<int64_t> prompt = pairs.front().prompt;
    Require(!prompt.empty(), ErrorCode::kInvalidArgument, "an example's prompt encodes to no tokens: give it some text");
    // As MakeBatch cuts the row of the longest candidate: keep BOS, drop the prompt's beginning.
    const size_t full = 1 + prompt.size() + longest_completion + 1;
    if (full > static_cast<size_t>(max_tokens_)) {
      const size_t drop = std::min(full - static_cast<size_t>(max_tokens_), prompt.size() - 1);
      prompt.erase(prompt.begin(), prompt.begin() + static_cast<long>(drop));
    }
    std::vector<int64_t> row = {bos_}, mask = {1}, target = {-100};
    row.insert(row.end(), prompt.begin(), prompt.end() - 1);
    mask.resize(row.size(), 1);
    target.resize(row.size(), -100);
    for (size_t k = 0; k < pairs.size(); ++k) {
      const auto segment = static_cast<int64_t>(k + 2);
      row.push_back(prompt.back());
      target.push_back(-100);
      for (int64_t token : pairs[k].completion) {
        row.push_back(token);
        target.push_back(token);
      }
      row.push_back(eos_);
      target.push_back(eos_);
      mask.resize(row.size(), segment);
    }
    longest = std::max(longest, row.size());
    rows.push_back(std::move(row));
    masks.push_back(std::move(mask));
    targets.push_back(std::move(target));
  }
  return RightPadded(rows, masks, targets, static_cast<int64_t>(longest), std::vector<uint64_t>(rows.size(), 0));
}

std::vector<std::vector<std::string>> ExampleEncoder::CandidateGroups(const std::vector<std::string>& candidates,
                                                                      int64_t max_row_tokens) const {
  std::vector<std::vector<std::string>> groups;
  int64_t used = max_row_tokens;  // forces a first group
  for (const std::string& c : candidates) {
    const int64_t cost = static_cast<int64_t>(Encode("", c).completion.size()) + 3;
    Require(max_tokens_ + cost <= max_row_tokens, ErrorCode::kInvalidArgument,
            "the label '" + Excerpt(c) + "' after a prompt of max_tokens " + std::to_string(max_tokens_) +
                " needs more than the model's " + std::to_string(max_row_tokens) + " positions: lower max_tokens");
    if (used + cost > max_row_tokens) {
      groups.emplace_back();
      used = max_tokens_;
    }
    groups.back().push_back(c);
    used += cost;
  }
  return groups;
}

Batch SampleWindows(const std::vector<int32_t>& stream, int64_t batch, int64_t tokens, std::mt19937_64& rng) {
  Require(static_cast<int64_t>(stream.size()) > tokens + 1, ErrorCode::kInvalidArgument,
          "the token stream is shorter than one window");
  std::uniform_int_distribution<size_t> start(0, stream.size() - static_cast<size_t>(tokens) - 1);
  Batch b{torch::empty({batch, tokens}, torch::kLong), torch::ones({batch, tokens}, torch::kLong),
          torch::empty({batch, tokens}, torch::kLong), {}};
  auto ids = b.ids.accessor<int64_t, 2>();
  for (int64_t i = 0; i < batch; ++i) {
    const size_t s = start(rng);
    b.sample_ids.push_back(s);
    for (int64_t j = 0; j < tokens; ++j) ids[i][j] = stream[s + static_cast<size_t>(j)];
  }
  b.labels.copy_(b.ids);  // NextTokenLoss shifts by one
  return b;
}

}  // namespace amaq
