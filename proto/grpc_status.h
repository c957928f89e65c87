// amaq::Error <-> gRPC status: the one table the server and the client share.
//
// Every ErrorCode has exactly one gRPC status code (the server answers with it); a client maps a
// status back to the ErrorCode it came from, and the statuses gRPC itself produces when a link or
// a stream breaks (DEADLINE_EXCEEDED, CANCELLED, ABORTED) to kUnavailable: a reconnect cures them.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "common/base/error.h"

namespace amaq {

grpc::StatusCode StatusCodeOf(ErrorCode code);
ErrorCode ErrorCodeOf(grpc::StatusCode code);
// The amaq::Error a client raises for a failed call: "<what>: <server's message> (gRPC status N)".
Error ToError(const grpc::Status& status, const std::string& what);

}  // namespace amaq
