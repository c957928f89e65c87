// ServerOptions: what amaq-server's settings give the server's core (SplitServer, SessionStore).
#pragma once

#include <cstdint>
#include <string>

#include "common/base/env.h"
#include "common/model/lora.h"
#include "quant/method_settings.h"
#include "server/adapter_average.h"

namespace amaq::server {

// The defaults here are amaq-server's (server/server_config.cc declares the keys that set them).
struct ServerOptions {
  std::string model_dir = "models/amaq-base";
  int64_t cut_layer = 2;
  std::string device = "auto";  // auto | cpu | cuda
  std::string base_weights = "fp32";  // fp32 | bf16 | nf4 | int8 (common/model/base_weights.h); clients must match
  std::string compute_dtype = "auto";  // fp32 | bf16 | auto: the server layers' activations (LoRA stays fp32; common/model/compute_dtype.h)
  LoraConfig lora;
  double lr = 2e-3;
  double max_grad_norm = 0;  // clip the server LoRA's gradient norm per step (0: no clipping)
  bool shared_lora = false;
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 100;  // applied training steps (all clients) between checkpoints
  int64_t max_batch_tokens = 65536;
  int64_t max_sequence_tokens = 0;  // tokens per row; 0: the model's max_position_embeddings (never more)
  double max_steps_per_second = 0;  // per client; 0: no limit (RESOURCE_EXHAUSTED above it)
  // Budgets of a step's estimated memory (server/step_cost.h), alone and with the decoding cache it
  // leaves its client; 0: a quarter and a half of the device's memory (RESOURCE_EXHAUSTED above them).
  int64_t max_step_memory_mb = 0, max_client_memory_mb = 0;
  quant::MethodSettings method_settings;  // the methods' own settings the server takes (quant/method_settings.h)
  // A session whose client has had no open stream and sent nothing for this long is written to
  // checkpoint_dir/sessions/ and dropped from memory; its client's next Join loads it (0: never).
  double session_ttl_seconds = 0;
  // All sessions' state together: decoding caches, AQ-SGD caches in memory, stored replies, the
  // per-client LoRA with its optimizer (0: no bound). Past it, a step first moves the least
  // recently seen sessions (not those of its batch) to checkpoint_dir/sessions/ as session_ttl_seconds
  // does; without checkpoint_dir, or with nothing left to move, the step is refused.
  double max_sessions_memory_mb = 0;
  AverageOptions averaging;  // collaborative mode's aggregate of the clients' adapters
  uint64_t seed = 1;
  Env* env = Env::Default();  // checkpoints, evicted sessions, AQ-SGD histories and idle time (not owned)
};

}  // namespace amaq::server
