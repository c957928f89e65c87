#include "common/split_step.h"

#include "common/error.h"

namespace amaq {

void CheckStepFields(const StepInput& in, int64_t max_batch_tokens, int64_t vocab_size) {
  Require(in.batch > 0 && in.tokens > 0 && in.batch <= max_batch_tokens && in.tokens <= max_batch_tokens &&
              in.batch * in.tokens <= max_batch_tokens,
          ErrorCode::kInvalidArgument,
          "step shape batch " + std::to_string(in.batch) + " x tokens " + std::to_string(in.tokens) +
              " is empty or above the server's max_batch_tokens " + std::to_string(max_batch_tokens));
  const int64_t n = in.batch * in.tokens;
  Require(static_cast<int64_t>(in.mask.size()) == n && static_cast<int64_t>(in.labels.size()) == n,
          ErrorCode::kInvalidArgument, "attention_mask and labels must have batch x tokens entries");
  const int32_t top = in.kind == StepKind::kScore ? kMaxCandidateSegments + 1 : 1;
  for (int64_t i = 0; i < n; ++i) {
    Require(in.mask[i] >= 0 && in.mask[i] <= top, ErrorCode::kInvalidArgument,
            "attention_mask entry " + std::to_string(in.mask[i]) + " is outside 0.." + std::to_string(top) +
                ": 0 padding, 1 token, and on SCORE steps 2.." + std::to_string(kMaxCandidateSegments + 1) +
                " candidate segments");
    Require(in.labels[i] == -100 || (in.labels[i] >= 0 && in.labels[i] < vocab_size), ErrorCode::kInvalidArgument,
            "label " + std::to_string(in.labels[i]) + " is not -100 or a token id below " + std::to_string(vocab_size));
  }
}

}  // namespace amaq
