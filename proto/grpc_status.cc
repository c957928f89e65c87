#include "proto/grpc_status.h"

#include <iterator>
#include <utility>

namespace amaq {
namespace {

constexpr std::pair<ErrorCode, grpc::StatusCode> kStatusOf[] = {
    {ErrorCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {ErrorCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {ErrorCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {ErrorCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {ErrorCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {ErrorCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
    {ErrorCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {ErrorCode::kInternal, grpc::StatusCode::INTERNAL},
};

// Row i is ErrorCode i, and every ErrorCode has its row (kInternal is the last one).
constexpr bool EveryCodeInOrder() {
  for (size_t i = 0; i < std::size(kStatusOf); ++i) {
    if (static_cast<size_t>(kStatusOf[i].first) != i) return false;
  }
  return std::size(kStatusOf) == static_cast<size_t>(ErrorCode::kInternal) + 1;
}
static_assert(EveryCodeInOrder(), "kStatusOf must list every ErrorCode, in the enum's order, with its gRPC status");

}  // namespace

grpc::StatusCode StatusCodeOf(ErrorCode code) { return kStatusOf[static_cast<size_t>(code)].second; }

ErrorCode ErrorCodeOf(grpc::StatusCode code) {
  switch (code) {  // statuses gRPC makes itself when a call breaks
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED: return ErrorCode::kUnavailable;
    case grpc::StatusCode::PERMISSION_DENIED: return ErrorCode::kUnauthenticated;
    default: break;
  }
  for (const auto& [error, status] : kStatusOf) {
    if (status == code) return error;
  }
  return ErrorCode::kInternal;
}

Error ToError(const grpc::Status& status, const std::string& what) {
  return Error(ErrorCodeOf(status.error_code()),
               what + ": " + status.error_message() + " (gRPC status " + std::to_string(status.error_code()) + ")");
}

}  // namespace amaq
