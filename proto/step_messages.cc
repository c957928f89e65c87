#include "proto/step_messages.h"

#include <algorithm>

#include "common/base/error.h"

namespace amaq {
namespace {

// How many chunks a codec message of `bytes` takes (an empty one still takes one).
size_t ChunkCount(size_t bytes, size_t chunk) { return std::max<size_t>(1, (bytes + chunk - 1) / chunk); }

template <typename Message>
void SetChunk(Message* m, const std::vector<uint8_t>& payload, size_t index, size_t count, size_t chunk) {
  m->set_chunk_index(static_cast<int>(index));
  m->set_chunk_count(static_cast<int>(count));
  const size_t begin = index * chunk, end = std::min(payload.size(), begin + chunk);
  if (begin < end) m->set_payload(payload.data() + begin, end - begin);
}

}  // namespace

v1::JoinRequest JoinRequestOf(const JoinInfo& info) {
  v1::JoinRequest r;
  r.set_client_id(info.client_id);
  r.set_model_fingerprint(info.fingerprint);
  r.set_cut_layer(static_cast<int32_t>(info.cut_layer));
  r.set_method(info.method);
  r.set_run(info.run);
  r.set_start(static_cast<v1::JoinRequest::RunStart>(info.start));
  return r;
}

JoinInfo JoinInfoOf(const v1::JoinRequest& r) {
  Require(r.start() >= v1::JoinRequest::CONTINUE && r.start() <= v1::JoinRequest::FRESH, ErrorCode::kInvalidArgument,
          "unknown run start " + std::to_string(r.start()) + ": CONTINUE, RESUME or FRESH (docs/protocol.md)");
  return JoinInfo{r.client_id(), r.model_fingerprint(), r.cut_layer(), r.method(), r.run(), static_cast<RunStart>(r.start())};
}

std::vector<v1::StepRequest> StepRequests(const StepInput& input, size_t max_chunk_bytes) {
  const size_t count = ChunkCount(input.activation.size(), max_chunk_bytes);
  std::vector<v1::StepRequest> out(count);
  for (size_t i = 0; i < count; ++i) {
    v1::StepRequest& r = out[i];
    r.set_step_id(input.step_id);
    r.set_kind(static_cast<v1::StepRequest::Kind>(input.kind));
    if (i == 0) {
      *r.mutable_sample_ids() = {input.sample_ids.begin(), input.sample_ids.end()};
      r.set_batch(static_cast<int32_t>(input.batch));
      r.set_tokens(static_cast<int32_t>(input.tokens));
      *r.mutable_attention_mask() = {input.mask.begin(), input.mask.end()};
      *r.mutable_labels() = {input.labels.begin(), input.labels.end()};
      r.set_cache(static_cast<v1::StepRequest::DecodeCache>(input.cache));
      if (input.kind == StepKind::kScore) {
        r.set_candidates(static_cast<int32_t>(input.targets.count));
        *r.mutable_target_positions() = {input.targets.positions.begin(), input.targets.positions.end()};
        *r.mutable_target_tokens() = {input.targets.tokens.begin(), input.targets.tokens.end()};
        *r.mutable_target_candidates() = {input.targets.candidates.begin(), input.targets.candidates.end()};
      }
      if (input.micro_batches != 1) {
        r.set_micro_batch(input.micro_batch);
        r.set_micro_batches(input.micro_batches);
        r.set_loss_scale(input.loss_scale);
      }
    }
    SetChunk(&r, input.activation, i, count, max_chunk_bytes);
  }
  return out;
}

std::vector<v1::StepReply> StepReplies(const StepResult& result, size_t max_chunk_bytes) {
  const size_t count = ChunkCount(result.gradient.size(), max_chunk_bytes);
  std::vector<v1::StepReply> out(count);
  for (size_t i = 0; i < count; ++i) {
    v1::StepReply& r = out[i];
    r.set_step_id(result.step_id);
    if (i == 0) {
      r.set_loss(result.loss);
      r.set_duplicate(result.duplicate);
      r.set_average_bits(result.average_bits);
      r.set_server_seconds(result.server_seconds);
      *r.mutable_scores() = {result.scores.begin(), result.scores.end()};
      *r.mutable_next_tokens() = {result.next_tokens.begin(), result.next_tokens.end()};
    }
    SetChunk(&r, result.gradient, i, count, max_chunk_bytes);
  }
  return out;
}

void ToNamedTensors(const NamedFloats& tensors, google::protobuf::RepeatedPtrField<v1::NamedTensor>* out) {
  for (const auto& [name, t] : tensors) {
    v1::NamedTensor* m = out->Add();
    m->set_name(name);
    *m->mutable_shape() = {t.shape.begin(), t.shape.end()};
    *m->mutable_values() = {t.values.begin(), t.values.end()};
  }
}

NamedFloats FromNamedTensors(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& tensors) {
  NamedFloats out;
  for (const v1::NamedTensor& t : tensors) {
    out[t.name()] = NamedFloat{{t.shape().begin(), t.shape().end()}, {t.values().begin(), t.values().end()}};
  }
  return out;
}

std::vector<v1::ServerAdapter> ServerAdapterParts(const ServerAdapterInfo& info, size_t max_part_bytes) {
  std::vector<v1::ServerAdapter> parts(1);
  v1::ServerAdapter& first = parts.front();
  first.set_shared(info.shared);
  first.set_lora_rank(static_cast<int32_t>(info.lora_rank));
  first.set_lora_alpha(info.lora_alpha);
  for (const std::string& t : info.target_modules) first.add_target_modules(t);
  first.set_applied_steps(info.applied_steps);
  size_t part_bytes = 0;
  for (const auto& [name, t] : info.tensors) {
    if (part_bytes >= max_part_bytes) {
      parts.emplace_back();
      part_bytes = 0;
    }
    v1::NamedTensor* m = parts.back().add_tensors();
    m->set_name(name);
    *m->mutable_shape() = {t.shape.begin(), t.shape.end()};
    *m->mutable_values() = {t.values.begin(), t.values.end()};
    part_bytes += t.values.size() * sizeof(float);
  }
  return parts;
}

void AddServerAdapterPart(const v1::ServerAdapter& part, size_t index, ServerAdapterInfo* info, uint64_t max_bytes) {
  if (index == 0) {
    info->shared = part.shared();
    info->lora_rank = part.lora_rank();
    info->lora_alpha = part.lora_alpha();
    info->target_modules.assign(part.target_modules().begin(), part.target_modules().end());
    info->applied_steps = part.applied_steps();
  }
  uint64_t received = 0;
  for (const auto& [name, t] : info->tensors) received += t.values.size() * sizeof(float);
  for (const v1::NamedTensor& t : part.tensors()) {
    received += static_cast<uint64_t>(t.values_size()) * sizeof(float);
    Require(received <= max_bytes, ErrorCode::kDataLoss,
            "the server's adapter passes " + std::to_string(max_bytes) +
                " bytes of values: it is not an adapter this client can hold; check the server's lora_rank");
    Require(info->tensors.count(t.name()) == 0, ErrorCode::kDataLoss,
            "the server sent the adapter tensor '" + t.name().substr(0, 128) + "' twice: the server is faulty; report it");
    info->tensors[t.name()] = NamedFloat{{t.shape().begin(), t.shape().end()}, {t.values().begin(), t.values().end()}};
  }
}

v1::MetricReport MetricReportMessage(int64_t step, const std::string& name, double value) {
  v1::MetricReport m;
  m.set_step(step);
  m.set_name(name);
  m.set_value(value);
  return m;
}

}  // namespace amaq
