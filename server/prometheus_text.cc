#include "server/prometheus_text.h"

#include <sstream>

#include "server/split_server.h"

namespace amaq::server {

std::string PrometheusText(const SplitTrainingService& service) {
  std::ostringstream out;
  const auto stats = service.server().Stats();
  const auto traffic = service.traffic();
  const auto metric = [&](const char* name, const char* type, const char* help) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  metric("amaq_bytes_up_total", "counter", "Protobuf bytes received from the client");
  for (const auto& [id, t] : traffic) out << "amaq_bytes_up_total{client=\"" << id << "\"} " << t.bytes_up << "\n";
  metric("amaq_bytes_down_total", "counter", "Protobuf bytes sent to the client");
  for (const auto& [id, t] : traffic) out << "amaq_bytes_down_total{client=\"" << id << "\"} " << t.bytes_down << "\n";
  metric("amaq_steps_total", "counter", "Training steps applied");
  for (const auto& [id, s] : stats) out << "amaq_steps_total{client=\"" << id << "\"} " << s.steps << "\n";
  metric("amaq_loss", "gauge", "Loss of the last training step");
  for (const auto& [id, s] : stats) out << "amaq_loss{client=\"" << id << "\"} " << s.last_loss << "\n";
  metric("amaq_average_bits", "gauge", "Average bits of the last activation received");
  for (const auto& [id, s] : stats) out << "amaq_average_bits{client=\"" << id << "\"} " << s.average_bits << "\n";
  metric("amaq_step_seconds", "gauge", "Server time of the last training step");
  for (const auto& [id, s] : stats) out << "amaq_step_seconds{client=\"" << id << "\"} " << s.last_step_seconds << "\n";
  metric("amaq_connected", "gauge", "1 while the client's step stream is open");
  for (const auto& [id, t] : traffic) out << "amaq_connected{client=\"" << id << "\"} " << (t.connected ? 1 : 0) << "\n";
  metric("amaq_open_streams", "gauge", "Step streams open now");
  out << "amaq_open_streams " << service.open_streams() << "\n";
  metric("amaq_checkpoint_failures_total", "counter", "Periodic checkpoints that failed (the previous one stays)");
  out << "amaq_checkpoint_failures_total " << service.server().checkpoint_failures() << "\n";
  metric("amaq_batches_total", "counter", "Batches the compute stage ran (one or more clients' steps each)");
  out << "amaq_batches_total " << service.worker().batches() << "\n";
  metric("amaq_batched_steps_total", "counter", "Steps in those batches (divided by amaq_batches_total: steps per batch)");
  out << "amaq_batched_steps_total " << service.worker().batched_steps() << "\n";
  metric("amaq_sessions_in_memory", "gauge", "Client sessions held in memory");
  out << "amaq_sessions_in_memory " << service.server().sessions_in_memory() << "\n";
  metric("amaq_sessions_memory_bytes", "gauge", "What max_sessions_memory_mb counts, as of the last step: decoding caches, AQ-SGD caches, stored replies, per-client LoRA");
  out << "amaq_sessions_memory_bytes " << service.server().sessions_memory_bytes() << "\n";
  metric("amaq_sessions_evicted_total", "counter", "Idle sessions moved to checkpoint_dir/sessions (session_ttl_seconds)");
  out << "amaq_sessions_evicted_total " << service.server().sessions_evicted() << "\n";
  if (service.options().replica_status) {  // a replica set: which replica these steps were served by
    const ReplicaStatus r = service.options().replica_status();
    metric("amaq_replica_rank", "gauge", "This server's rank in its replica set (the steps above were served here)");
    out << "amaq_replica_rank " << r.rank << "\n";
    metric("amaq_replicas", "gauge", "Servers in the replica set");
    out << "amaq_replicas " << r.replicas << "\n";
    metric("amaq_replica_generation", "gauge", "The replica set's generation this server formed at (one more each start or re-formation)");
    out << "amaq_replica_generation " << r.generation << "\n";
    metric("amaq_replica_synchronisations_total", "counter", "Averages of the shared LoRA over the replicas");
    out << "amaq_replica_synchronisations_total " << r.synchronisations << "\n";
    metric("amaq_replica_synchronisation_failures_total", "counter", "Averages of the shared LoRA that failed (a replica went away)");
    out << "amaq_replica_synchronisation_failures_total " << r.synchronisation_failures << "\n";
  }
  return out.str();
}

}  // namespace amaq::server
