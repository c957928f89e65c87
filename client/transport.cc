#include "client/transport.h"

#include "common/base/error.h"

namespace amaq::client {

StepResult Transport::Receive() {
  Require(!unsent_.empty(), ErrorCode::kInternal, "Receive without a step sent: Send the step first");
  const StepInput input = std::move(unsent_.front());
  unsent_.pop_front();
  try {
    return Step(input);
  } catch (...) {
    unsent_.clear();  // a failure loses every step in flight
    throw;
  }
}

}  // namespace amaq::client
