#include "server/step_assembler.h"

#include <utility>

#include "common/base/error.h"

namespace amaq::server {

bool StepAssembler::Add(const amaq::v1::StepRequest& chunk) {
  try {
    Require(chunk.chunk_count() >= 1 && chunk.chunk_count() <= limits_.max_chunks && chunk.chunk_index() == expected_chunk_ &&
                static_cast<int64_t>(chunk.payload().size()) <= limits_.max_chunk_bytes,
            ErrorCode::kInvalidArgument,
            "step chunk " + std::to_string(chunk.chunk_index()) + "/" + std::to_string(chunk.chunk_count()) +
                " is out of order, one of more than " + std::to_string(limits_.max_chunks) +
                " or larger than max_chunk_bytes (" + std::to_string(limits_.max_chunk_bytes) + "): send chunks 0..count-1 in order");
    if (expected_chunk_ == 0) {
      Require(amaq::v1::StepRequest::Kind_IsValid(chunk.kind()), ErrorCode::kInvalidArgument,
              "unknown step kind " + std::to_string(chunk.kind()) + ": use TRAIN, SCORE or NEXT_TOKEN");
      input_ = StepInput{};
      input_.step_id = chunk.step_id();
      input_.kind = static_cast<StepKind>(chunk.kind());
      input_.sample_ids.assign(chunk.sample_ids().begin(), chunk.sample_ids().end());
      input_.batch = chunk.batch();
      input_.tokens = chunk.tokens();
      input_.mask.assign(chunk.attention_mask().begin(), chunk.attention_mask().end());
      input_.labels.assign(chunk.labels().begin(), chunk.labels().end());
      input_.targets.count = chunk.candidates();
      input_.targets.positions.assign(chunk.target_positions().begin(), chunk.target_positions().end());
      input_.targets.tokens.assign(chunk.target_tokens().begin(), chunk.target_tokens().end());
      input_.targets.candidates.assign(chunk.target_candidates().begin(), chunk.target_candidates().end());
      Require(amaq::v1::StepRequest::DecodeCache_IsValid(chunk.cache()), ErrorCode::kInvalidArgument,
              "unknown decoding cache " + std::to_string(chunk.cache()) + ": use NO_CACHE, START_CACHE or EXTEND_CACHE");
      input_.cache = static_cast<DecodeCache>(chunk.cache());
      input_.micro_batch = chunk.micro_batch();
      input_.micro_batches = chunk.micro_batches() == 0 ? 1 : chunk.micro_batches();
      input_.loss_scale = chunk.loss_scale() == 0 ? 1.0f : chunk.loss_scale();
      chunk_count_ = chunk.chunk_count();
    } else {
      Require(chunk.chunk_count() == chunk_count_ && chunk.step_id() == input_.step_id &&
                  static_cast<StepKind>(chunk.kind()) == input_.kind,
              ErrorCode::kInvalidArgument, "a step's chunks must agree on step_id, kind and chunk_count");
    }
    Require(input_.activation.size() + chunk.payload().size() <= limits_.max_step_bytes, ErrorCode::kResourceExhausted,
            "step " + std::to_string(input_.step_id) + " exceeds the server's " + std::to_string(limits_.max_step_bytes) +
                " bytes per step (max_batch_tokens x hidden size x 4 and the codec's metadata): send smaller batches");
    input_.activation.insert(input_.activation.end(), chunk.payload().begin(), chunk.payload().end());
    if (++expected_chunk_ < chunk_count_) return false;
    expected_chunk_ = 0;
    CheckStepFields(input_, limits_.shape);
    return true;
  } catch (const Error&) {
    expected_chunk_ = 0;
    input_ = StepInput{};
    throw;
  }
}

StepInput StepAssembler::Take() {
  StepInput out = std::move(input_);
  input_ = StepInput{};
  return out;
}

}  // namespace amaq::server
