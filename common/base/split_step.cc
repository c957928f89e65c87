#include "common/base/split_step.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <set>
#include <sstream>

#include "common/base/error.h"

namespace amaq {

std::string RunMismatch(const std::string& stored, const std::string& asked) {
  const auto words = [](const std::string& run) {
    std::map<std::string, std::string> out;
    std::istringstream in(run);
    for (std::string word; in >> word;) {
      const size_t eq = word.find('=');
      out[word.substr(0, eq)] = eq == std::string::npos ? "" : word.substr(eq + 1);
    }
    return out;
  };
  const std::map<std::string, std::string> before = words(stored), after = words(asked);
  std::set<std::string> keys;
  for (const auto* side : {&before, &after}) {
    for (const auto& [key, value] : *side) keys.insert(key);
  }
  const auto value = [](const std::map<std::string, std::string>& side, const std::string& key) {
    const auto it = side.find(key);
    return it == side.end() ? std::string("(none)") : Excerpt(it->second, 40);
  };
  std::string text;
  for (const std::string& key : keys) {
    const std::string was = value(before, key), now = value(after, key);
    if (was != now) text += (text.empty() ? "" : ", ") + Excerpt(key, 40) + " " + was + " -> " + now;
  }
  return "it differs in " + (text.empty() ? std::string("nothing") : text) +
         ": set resume: true (--resume true) to continue it with these settings, or fresh: true (--fresh true) to "
         "discard it and start at step 0";
}

namespace {

// The targets of a SCORE step (none on the others), after its mask was checked.
void CheckScoreTargets(const StepInput& in, const StepShapeLimits& limits) {
  const ScoreTargets& t = in.targets;
  const auto n = static_cast<int64_t>(t.positions.size());
  if (in.kind != StepKind::kScore) {
    Require(n == 0 && t.tokens.empty() && t.candidates.empty() && t.count == 0, ErrorCode::kInvalidArgument,
            "score targets are for SCORE steps: send this step without them");
    return;
  }
  Require(t.count >= 1 && t.count <= kMaxCandidateSegments, ErrorCode::kInvalidArgument,
          "a SCORE step scores 1.." + std::to_string(kMaxCandidateSegments) + " candidates per row, not " +
              std::to_string(t.count) + ": set candidates (docs/protocol.md)");
  Require(n >= 1 && n <= 2 * in.batch * (in.tokens + t.count) && static_cast<int64_t>(t.tokens.size()) == n &&
              static_cast<int64_t>(t.candidates.size()) == n,
          ErrorCode::kInvalidArgument,
          "a SCORE step needs 1..2 x batch x (tokens + candidates) targets, each with a position, a token and a candidate: got " +
              std::to_string(n) + " positions, " + std::to_string(t.tokens.size()) + " tokens, " +
              std::to_string(t.candidates.size()) + " candidates");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = t.positions[i];
    Require(p >= 0 && p < in.batch * in.tokens && in.mask[static_cast<size_t>(p)] != 0, ErrorCode::kInvalidArgument,
            "score target " + std::to_string(i) + " reads position " + std::to_string(p) +
                ", which is padding or outside batch x tokens: a target reads a token's next-token distribution");
    Require(t.tokens[i] >= 0 && t.tokens[i] < limits.vocab_size && t.candidates[i] >= 0 && t.candidates[i] < t.count,
            ErrorCode::kInvalidArgument,
            "score target " + std::to_string(i) + " has token " + std::to_string(t.tokens[i]) + " and candidate " +
                std::to_string(t.candidates[i]) + ": tokens are ids below " + std::to_string(limits.vocab_size) +
                ", candidates below " + std::to_string(t.count));
  }
}

}  // namespace

void CheckStepFields(const StepInput& in, const StepShapeLimits& limits) {
  Require(in.step_id >= 0, ErrorCode::kInvalidArgument,
          "step id " + std::to_string(in.step_id) + " is negative: steps count up from 0");
  Require(in.batch > 0 && in.tokens > 0 && in.batch <= limits.max_batch_tokens && in.tokens <= limits.max_batch_tokens &&
              in.batch * in.tokens <= limits.max_batch_tokens,
          ErrorCode::kInvalidArgument,
          "step shape batch " + std::to_string(in.batch) + " x tokens " + std::to_string(in.tokens) +
              " is empty or above the server's max_batch_tokens " + std::to_string(limits.max_batch_tokens));
  Require(in.tokens <= limits.max_sequence_tokens, ErrorCode::kInvalidArgument,
          "step rows have " + std::to_string(in.tokens) + " tokens, above the server's max_sequence_tokens " +
              std::to_string(limits.max_sequence_tokens) + " (at most the model's positions): send shorter sequences");
  const int64_t n = in.batch * in.tokens;
  const bool score = in.kind == StepKind::kScore;
  Require(static_cast<int64_t>(in.mask.size()) == n && static_cast<int64_t>(in.labels.size()) == (score ? 0 : n),
          ErrorCode::kInvalidArgument,
          "attention_mask must have batch x tokens entries, and labels as many (none on SCORE steps, which score targets)");
  const int32_t top = score ? kMaxCandidateSegments + 1 : 1;
  bool any_token = false, any_label = false;  // the loss predicts labels from position 1 on
  for (int64_t i = 0; i < n; ++i) {
    Require(in.mask[i] >= 0 && in.mask[i] <= top, ErrorCode::kInvalidArgument,
            "attention_mask entry " + std::to_string(in.mask[i]) + " is outside 0.." + std::to_string(top) +
                ": 0 padding, 1 token, and on SCORE steps 2.." + std::to_string(kMaxCandidateSegments + 1) +
                " candidate segments");
    any_token = any_token || in.mask[i] != 0;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(in.labels.size()); ++i) {
    Require(in.labels[i] == -100 || (in.labels[i] >= 0 && in.labels[i] < limits.vocab_size), ErrorCode::kInvalidArgument,
            "label " + std::to_string(in.labels[i]) + " is not -100 or a token id below " + std::to_string(limits.vocab_size));
    any_label = any_label || (i % in.tokens != 0 && in.labels[i] != -100);
  }
  CheckScoreTargets(in, limits);
  Require(in.cache == DecodeCache::kNone || in.kind == StepKind::kNextToken, ErrorCode::kInvalidArgument,
          "a decoding cache is for NEXT_TOKEN steps: send this step without one");
  if (in.cache == DecodeCache::kStart) {
    for (int64_t r = 0; r < in.batch; ++r) {
      Require(in.mask[static_cast<size_t>((r + 1) * in.tokens - 1)] == 1, ErrorCode::kInvalidArgument,
              "row " + std::to_string(r) + " of a cached prompt does not end in a token: pad cached prompts on the left");
    }
  }
  if (in.cache == DecodeCache::kExtend) {
    Require(in.tokens == 1 && std::count(in.mask.begin(), in.mask.end(), 1) == static_cast<std::ptrdiff_t>(n),
            ErrorCode::kInvalidArgument, "a cached decoding step extends each row by one token (tokens 1, mask 1): send one token per row");
  }
  Require(in.micro_batches >= 1 && in.micro_batches <= kMaxMicroBatches && in.micro_batch >= 0 &&
              in.micro_batch < in.micro_batches && std::isfinite(in.loss_scale) && in.loss_scale > 0 && in.loss_scale <= 1 &&
              (in.micro_batches == 1 || in.kind == StepKind::kTrain),
          ErrorCode::kInvalidArgument,
          "micro-batch " + std::to_string(in.micro_batch) + " of " + std::to_string(in.micro_batches) + " with loss scale " +
              std::to_string(in.loss_scale) + " is not a part of a training step: send parts 0..n-1 (n <= " +
              std::to_string(kMaxMicroBatches) + ") of TRAIN steps, each scaled by its share in (0, 1] of the labels");
  Require(in.kind != StepKind::kTrain || (any_token && any_label), ErrorCode::kInvalidArgument,
          "training step " + std::to_string(in.step_id) +
              " has no token to learn (every label is -100 or every token is padding): leave such batches out");
}

}  // namespace amaq
