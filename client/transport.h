// Transport: how a client's Join and steps reach a server. GrpcTransport crosses the network
// (client/grpc_transport.h); LocalTransport calls a SplitServer in the same process, for tests
// and for measuring compute without a network. Failures of the link throw amaq::Error
// (kUnavailable); the server's refusals keep their codes.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "common/base/split_step.h"

namespace amaq::client {

class Transport {
 public:
  virtual ~Transport() = default;
  // Returns the server's last applied step of this client (-1: none).
  virtual int64_t Join(const JoinInfo& info) = 0;
  virtual StepResult Step(const StepInput& input) = 0;
  // Pipelined steps: Send starts a step without waiting for its answer, Receive returns the answer
  // to the oldest step sent and not yet answered. Either throws as Step does, and then every step
  // in flight is lost (send them again). This default sends nothing ahead: Receive runs the oldest
  // step sent, alone.
  virtual void Send(const StepInput& input) { unsent_.push_back(input); }
  virtual StepResult Receive();
  // Collaborative mode: uploads this client's adapter, returns the average over clients.
  virtual NamedFloats SyncAdapters(const NamedFloats& adapter) = 0;
  // The server's LoRA that trains with this client (its layers [cut, L)), for the whole adapter.
  virtual ServerAdapterInfo FetchAdapter() = 0;
  // Tells the server this client's evaluation result (shown in its live view).
  virtual void ReportMetric(int64_t step, const std::string& name, double value) = 0;
  // Whether the server joined last keeps a decoding cache for NEXT_TOKEN steps (DecodeCache).
  virtual bool server_decodes_with_cache() const { return true; }
  // Whether the server joined last takes TRAIN steps in parts (StepInput::micro_batch).
  virtual bool server_takes_micro_batches() const { return true; }
  // Whether the server joined last scores SCORE steps' targets (StepInput::targets).
  virtual bool server_scores_targets() const { return true; }
  // Whether steps cross a network link to the server (not calls within this process): only then
  // can sending a step in parts overlap transfers with compute (MicroBatchChoice).
  virtual bool over_network() const { return false; }
  // The server the steps go to now: its host:port (a replica set: the replica that serves this
  // client, once a Join has been sent there); empty in process.
  virtual std::string server() const { return ""; }
  // Bytes sent and received so far, as the transport measures them (the sockets, for gRPC).
  virtual uint64_t bytes_up() const = 0;
  virtual uint64_t bytes_down() const = 0;

 private:
  std::deque<StepInput> unsent_;  // the default Send's steps
};

}  // namespace amaq::client
