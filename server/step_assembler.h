// StepAssembler: turns one client's stream of StepRequest chunks into complete steps.
//
// Chunks must arrive in order (index 0..count-1), agree on step_id, kind and count, and stay within
// the limits: at most max_chunks chunks of at most max_chunk_bytes, at most max_step_bytes in all
// (the memory one client may make the server hold). The first chunk carries the step's fields;
// a complete step is checked with CheckStepFields (common/base/split_step.h). Torch-free and
// network-free: the gRPC service feeds it, and so does the fuzz target over server messages.
#pragma once

#include <cstdint>

#include "amaq/v1/split_training.pb.h"
#include "common/base/split_step.h"

namespace amaq::server {

struct StepLimits {
  int max_chunk_bytes = 1 << 20;
  int max_chunks = 4096;
  uint64_t max_step_bytes = uint64_t{256} << 20;
  StepShapeLimits shape;
};

class StepAssembler {
 public:
  explicit StepAssembler(StepLimits limits) : limits_(limits) {}

  // Adds one chunk; returns true when it completes a step (then take it with Take()). Throws
  // amaq::Error (kInvalidArgument, or kResourceExhausted for a step above max_step_bytes) for a
  // chunk that breaks the rules or a complete step with bad fields; the partial step is dropped.
  bool Add(const amaq::v1::StepRequest& chunk);
  StepInput Take();
  // True while a step is partly received.
  bool partial() const { return expected_chunk_ > 0; }

 private:
  StepLimits limits_;
  StepInput input_;
  int expected_chunk_ = 0, chunk_count_ = 0;
};

}  // namespace amaq::server
