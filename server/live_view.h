// The live view of a running server, served by MetricsHttp beside /metrics:
//   GET /            a page (server/live_view.html, built into the binary: no outside assets) that
//                    polls /api/status every 2 s and draws, per client, the loss, average-bits and
//                    metric curves, the histogram of the last activation's bit-widths and a table
//                    of bytes, bits and steps/s. It holds no data, so it is served without the
//                    token; it sends the token given in the address (…/#token=<metrics token>)
//                    as a bearer with every poll.
//   GET /api/status  the same data as JSON (below), guarded by the metrics token like /metrics;
//                    a client's own token (tokens_file) gets that client's row alone, an
//                    operator's (admin) every row, so a tenant can watch its run and no other.
//
// JSON: {"server_id", "device", "uptime_seconds", "clients": [{"id", "method", "connected", "steps",
//   "last_loss", "average_bits", "bytes_up", "bytes_down" (protobuf bytes), "steps_per_second"
//   (over the last minute of the curve), "width_shares": {"<bits>": share}, "metric_name",
//   "curve": {"step", "seconds", "loss", "average_bits", "mb_up", "mb_down"} (codec MB so far),
//   "metrics": {"step", "seconds", "value"}}]}.
#pragma once

#include <map>
#include <string>

#include "server/grpc_service.h"
#include "server/metrics_http.h"

namespace amaq::server {

// The JSON for `viewer`: every client, or the viewer's own.
std::string LiveStatusJson(const SplitTrainingService& service, double uptime_seconds, const Viewer& viewer);
// The page's HTML (server/live_view.html as built in).
const std::string& LiveViewHtml();
// "/" and "/api/status" for MetricsHttp. `service` must outlive the endpoint.
std::map<std::string, HttpPage> LiveViewPages(const SplitTrainingService& service);
// MetricsOptions::viewer_of from the service's tokens: a client's token views that client, an
// operator's every client. `service` must outlive the endpoint.
std::function<std::optional<Viewer>(const std::string& token)> LiveViewers(SplitTrainingService& service);

}  // namespace amaq::server
