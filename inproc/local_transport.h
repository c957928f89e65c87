// LocalTransport: a client's Transport that calls a SplitServer in the same process (through
// DirectTransport): the tests (the equivalence of split and local training) and amaq-study (many
// runs, no network) use it.
// Its byte counts are those of the gRPC messages GrpcTransport would exchange for the same calls
// (proto/step_messages.h: chunked at max_chunk_bytes, each with gRPC's length prefix), so that an
// in-process run reports the protocol bytes of a network run. `server` must outlive this object.
#pragma once

#include <string>
#include <utility>

#include "amaq/v1/split_training.pb.h"
#include "inproc/direct_transport.h"
#include "proto/step_messages.h"
#include "server/split_server.h"

namespace amaq::inproc {

class LocalTransport : public client::Transport {
 public:
  // `max_chunk_bytes` and `server_id` as the gRPC service would announce them (its defaults).
  // `server` must outlive the transport.
  explicit LocalTransport(server::SplitServer& server, size_t max_chunk_bytes = 1 << 20,
                          std::string server_id = "amaq-server")
      : direct_(server), max_chunk_bytes_(max_chunk_bytes), server_id_(std::move(server_id)) {}
  int64_t Join(const JoinInfo& info) override {
    const int64_t last = direct_.Join(info);
    v1::JoinReply reply;
    reply.set_last_applied_step(last);
    reply.set_server_id(server_id_);
    reply.set_max_chunk_bytes(static_cast<int32_t>(max_chunk_bytes_));
    reply.set_decode_cache(true);
    reply.set_score_targets(true);
    reply.set_micro_batches(direct_.server_takes_micro_batches());
    up_ += FramedBytes(JoinRequestOf(info));
    down_ += FramedBytes(reply);
    return last;
  }
  StepResult Step(const StepInput& input) override {
    for (const v1::StepRequest& m : StepRequests(input, max_chunk_bytes_)) up_ += FramedBytes(m);
    StepResult r = direct_.Step(input);
    for (const v1::StepReply& m : StepReplies(r, max_chunk_bytes_)) down_ += FramedBytes(m);
    return r;
  }
  NamedFloats SyncAdapters(const NamedFloats& adapter) override {
    v1::AdapterUpload request;
    ToNamedTensors(adapter, request.mutable_tensors());
    const NamedFloats average = direct_.SyncAdapters(adapter);
    v1::AdapterAverage reply;
    ToNamedTensors(average, reply.mutable_tensors());
    reply.set_clients(direct_.averaged_clients());
    up_ += FramedBytes(request);
    down_ += FramedBytes(reply);
    return average;
  }
  ServerAdapterInfo FetchAdapter() override {
    const ServerAdapterInfo info = direct_.FetchAdapter();
    up_ += FramedBytes(v1::AdapterRequest());
    for (const v1::ServerAdapter& part : ServerAdapterParts(info, max_chunk_bytes_)) down_ += FramedBytes(part);
    return info;
  }
  void ReportMetric(int64_t step, const std::string& name, double value) override {
    direct_.ReportMetric(step, name, value);
    up_ += FramedBytes(MetricReportMessage(step, name, value));
    down_ += FramedBytes(v1::MetricAck());
  }
  bool server_takes_micro_batches() const override { return direct_.server_takes_micro_batches(); }
  uint64_t bytes_up() const override { return up_; }
  uint64_t bytes_down() const override { return down_; }

 private:
  DirectTransport direct_;
  size_t max_chunk_bytes_;
  std::string server_id_;
  uint64_t up_ = 0, down_ = 0;
};

}  // namespace amaq::inproc
