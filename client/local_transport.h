// LocalTransport: a client's Transport that calls a SplitServer in the same process. Used by tests
// (the equivalence of split and local training) and to measure compute without a network; its
// byte counts are the codec messages' sizes.
#pragma once

#include "client/transport.h"
#include "server/split_server.h"

namespace amaq::client {

class LocalTransport : public Transport {
 public:
  explicit LocalTransport(server::SplitServer& server) : server_(server) {}
  int64_t Join(const JoinInfo& info) override {
    client_id_ = info.client_id;
    return server_.Join(info.client_id, info.fingerprint, info.cut_layer, info.method);
  }
  StepResult Step(const StepInput& input) override {
    up_ += input.activation.size();
    StepResult r = server_.Step(client_id_, input);
    down_ += r.gradient.size();
    return r;
  }
  NamedFloats SyncAdapters(const NamedFloats& adapter) override {
    int clients = 0;
    return server_.AverageAdapters(client_id_, adapter, &clients);
  }
  uint64_t bytes_up() const override { return up_; }
  uint64_t bytes_down() const override { return down_; }

 private:
  server::SplitServer& server_;
  std::string client_id_;
  uint64_t up_ = 0, down_ = 0;
};

}  // namespace amaq::client
