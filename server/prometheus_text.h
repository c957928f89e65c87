// The Prometheus text of a running server (GET /metrics): per client bytes up and down (protobuf
// bytes as the service counted them), applied steps, last loss, average bits of the last
// activation, last step latency, connected; open streams, failed checkpoints, batches and the
// steps in them, sessions in memory and sessions evicted.
#pragma once

#include <string>

#include "server/grpc_service.h"

namespace amaq::server {

std::string PrometheusText(const SplitTrainingService& service);

}  // namespace amaq::server
