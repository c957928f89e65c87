// Built against gRPC, protobuf and the step messages alone, without LibTorch's include paths: the
// build fails when one of these headers comes to include torch again (issue 38 item 6; the
// transport side of the server compiles without it, docs/architecture.md).
#include "server/grpc_service.h"
#include "server/step_worker.h"
