// DirectTransport: a client's Transport that calls a SplitServer in the same process and measures
// nothing. It needs no protobuf, so it builds where only LibTorch is installed (amaq-gpu-check on
// a GPU host); LocalTransport (inproc/local_transport.h) wraps it with the protocol's byte counts.
// `server` must outlive the transport.
#pragma once

#include <string>

#include "client/transport.h"
#include "server/split_server.h"

namespace amaq::inproc {

class DirectTransport : public client::Transport {
 public:
  explicit DirectTransport(server::SplitServer& server) : server_(server) {}
  int64_t Join(const JoinInfo& info) override {
    client_id_ = info.client_id;
    return server_.Join(info.client_id, info.fingerprint, info.cut_layer, info.method, info.run, info.start);
  }
  StepResult Step(const StepInput& input) override { return server_.Step(client_id_, input); }
  NamedFloats SyncAdapters(const NamedFloats& adapter) override {
    return server_.AverageAdapters(client_id_, adapter, &averaged_clients_);
  }
  ServerAdapterInfo FetchAdapter() override { return server_.AdapterOf(client_id_); }
  void ReportMetric(int64_t step, const std::string& name, double value) override {
    server_.ReportMetric(client_id_, step, name, value);
  }
  bool server_takes_micro_batches() const override { return server_.takes_micro_batches(); }
  uint64_t bytes_up() const override { return 0; }
  uint64_t bytes_down() const override { return 0; }

  // The number of clients in the last average SyncAdapters returned.
  int averaged_clients() const { return averaged_clients_; }

 private:
  server::SplitServer& server_;
  std::string client_id_;
  int averaged_clients_ = 0;
};

}  // namespace amaq::inproc
