#include "common/model/batching.h"

#include <algorithm>
#include <utility>

#include "common/base/error.h"

namespace amaq {
namespace {

// Rows of ids and mask values, right-padded to `tokens` (id 0, mask 0).
std::pair<torch::Tensor, torch::Tensor> PadRows(const std::vector<std::vector<int64_t>>& rows,
                                                const std::vector<std::vector<int64_t>>& masks, int64_t tokens) {
  const auto b = static_cast<int64_t>(rows.size());
  torch::Tensor ids_tensor = torch::zeros({b, tokens}, torch::kLong), mask_tensor = torch::zeros({b, tokens}, torch::kLong);
  auto ids = ids_tensor.accessor<int64_t, 2>();
  auto mask = mask_tensor.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) {
      ids[i][static_cast<int64_t>(j)] = rows[i][j];
      mask[i][static_cast<int64_t>(j)] = masks[i][j];
    }
  }
  return {ids_tensor, mask_tensor};
}

// PadRows with labels beside them (-100 in the padding).
Batch RightPadded(const std::vector<std::vector<int64_t>>& rows, const std::vector<std::vector<int64_t>>& masks,
                  const std::vector<std::vector<int64_t>>& targets, int64_t tokens, std::vector<uint64_t> sample_ids) {
  auto [ids, mask] = PadRows(rows, masks, tokens);
  Batch batch{ids, mask, torch::full({ids.size(0), tokens}, -100, torch::kLong), std::move(sample_ids)};
  auto labels = batch.labels.accessor<int64_t, 2>();
  for (size_t i = 0; i < targets.size(); ++i) {
    for (size_t j = 0; j < targets[i].size(); ++j) labels[static_cast<int64_t>(i)][static_cast<int64_t>(j)] = targets[i][j];
  }
  return batch;
}

// How many tokens every sequence begins with (at most the shortest one's).
size_t SharedPrefix(const std::vector<std::vector<int64_t>>& sequences) {
  size_t shared = sequences.front().size();
  for (const std::vector<int64_t>& s : sequences) {
    shared = std::min(shared, s.size());
    while (shared > 0 && !std::equal(s.begin(), s.begin() + static_cast<long>(shared), sequences.front().begin())) --shared;
  }
  return shared;
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

CandidateBatch ExampleEncoder::MakeCandidateBatch(const std::vector<const Example*>& examples,
                                                  const std::vector<std::string>& candidates) const {
  Require(!examples.empty() && !candidates.empty(), ErrorCode::kInvalidArgument,
          "a candidate batch needs at least one example and one candidate");
  std::vector<std::vector<int64_t>> rows, masks;
  struct Target {
    size_t row;
    int64_t column, token;
    int32_t candidate;
  };
  std::vector<Target> targets;
  size_t longest = 0;
  for (size_t r = 0; r < examples.size(); ++r) {
    std::vector<int64_t> prompt;
    std::vector<std::vector<int64_t>> completions;
    size_t longest_completion = 0;
    for (const std::string& c : candidates) {
      Pair pair = Encode(examples[r]->prompt, c);
      Require(!pair.completion.empty(), ErrorCode::kInvalidArgument,
              "the label '" + Excerpt(c) + "' encodes to no tokens: give every label some text");
      longest_completion = std::max(longest_completion, pair.completion.size());
      prompt = std::move(pair.prompt);  // the same for every candidate
      completions.push_back(std::move(pair.completion));
    }
    Require(!prompt.empty(), ErrorCode::kInvalidArgument, "an example's prompt encodes to no tokens: give it some text");
    // As MakeBatch cuts the row of the longest candidate: keep BOS, drop the prompt's beginning.
    const size_t full = 1 + prompt.size() + longest_completion + 1;
    if (full > static_cast<size_t>(max_tokens_)) {
      const size_t drop = std::min(full - static_cast<size_t>(max_tokens_), prompt.size() - 1);
      prompt.erase(prompt.begin(), prompt.begin() + static_cast<long>(drop));
    }
    const size_t shared = SharedPrefix(completions);
    std::vector<int64_t> row = {bos_};
    row.insert(row.end(), prompt.begin(), prompt.end());
    row.insert(row.end(), completions.front().begin(), completions.front().begin() + static_cast<long>(shared));
    std::vector<int64_t> mask(row.size(), 1);
    for (size_t k = 0; k < completions.size(); ++k) {
      // Each token and then EOS is read at the position before it: the prompt's last token for the
      // first, the context for the rest of the shared tokens, then the candidate's own segment.
      const std::vector<int64_t>& c = completions[k];
      auto before = static_cast<int64_t>(prompt.size());
      for (size_t j = 0; j <= c.size(); ++j) {
        targets.push_back({r, before, j < c.size() ? c[j] : eos_, static_cast<int32_t>(k)});
        if (j == c.size()) break;
        if (j < shared) {
          before = static_cast<int64_t>(prompt.size() + 1 + j);
        } else {
          row.push_back(c[j]);
          mask.push_back(static_cast<int64_t>(k + 2));
          before = static_cast<int64_t>(row.size() - 1);
        }
      }
    }
    longest = std::max(longest, row.size());
    rows.push_back(std::move(row));
    masks.push_back(std::move(mask));
  }
  auto [ids, mask] = PadRows(rows, masks, static_cast<int64_t>(longest));
  CandidateBatch batch{ids, mask, {}};
  batch.targets.count = static_cast<int64_t>(candidates.size());
  for (const Target& t : targets) {
    batch.targets.positions.push_back(static_cast<int32_t>(t.row * longest + static_cast<size_t>(t.column)));
    batch.targets.tokens.push_back(static_cast<int32_t>(t.token));
    batch.targets.candidates.push_back(t.candidate);
  }
  return batch;
}

std::vector<std::vector<std::string>> ExampleEncoder::CandidateGroups(const std::vector<std::string>& candidates,
                                                                      int64_t max_row_tokens) const {
  std::vector<std::vector<std::string>> groups;
  int64_t used = max_row_tokens;  // forces a first group
  for (const std::string& c : candidates) {
    const int64_t cost = static_cast<int64_t>(Encode("", c).completion.size()) + 1;
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
