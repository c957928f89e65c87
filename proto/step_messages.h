// The protobuf messages of one split step, as both sides put them on the wire: a StepInput becomes
// StepRequest chunks, a StepResult StepReply chunks, each chunk carrying at most max_chunk_bytes of
// the codec message (the first chunk also carries the step's other fields); named tensors
// travel whole. The gRPC client and
// service send exactly these; the in-process transport counts them, so that a study run and a
// network run report the same protocol bytes (FramedBytes: the serialized message plus gRPC's
// 5-byte length prefix; TLS records, HTTP/2 frames and headers come on top at the socket).
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstdint>
#include <string>
#include <vector>

#include "amaq/v1/split_training.pb.h"
#include "common/base/split_step.h"

namespace amaq {

v1::JoinRequest JoinRequestOf(const JoinInfo& info);
// Throws amaq::Error (kInvalidArgument) for a RunStart this build does not know.
JoinInfo JoinInfoOf(const v1::JoinRequest& request);
std::vector<v1::StepRequest> StepRequests(const StepInput& input, size_t max_chunk_bytes);
std::vector<v1::StepReply> StepReplies(const StepResult& result, size_t max_chunk_bytes);

// Named tensors (collaborative adapter averaging) to and from their protobuf form.
void ToNamedTensors(const NamedFloats& tensors, google::protobuf::RepeatedPtrField<v1::NamedTensor>* out);
NamedFloats FromNamedTensors(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& tensors);

// The server's LoRA of a client (FetchAdapter) as the parts of its stream: whole tensors, a part
// closed once it holds max_part_bytes of values or more (a larger tensor travels alone); the first
// part (there is always one) carries the settings.
std::vector<v1::ServerAdapter> ServerAdapterParts(const ServerAdapterInfo& info, size_t max_part_bytes);
// Adds the `index`-th part of a stream to `info` (index 0 also sets the settings). Throws
// amaq::Error (kDataLoss) for a tensor named twice, or once the values received pass `max_bytes`;
// `info` then holds the parts before and the tensors of this one up to the refused one.
constexpr uint64_t kMaxServerAdapterBytes = uint64_t{4} << 30;
void AddServerAdapterPart(const v1::ServerAdapter& part, size_t index, ServerAdapterInfo* info,
                          uint64_t max_bytes = kMaxServerAdapterBytes);

v1::MetricReport MetricReportMessage(int64_t step, const std::string& name, double value);

// Bytes of one gRPC message on the stream: the length-prefixed serialized protobuf.
inline uint64_t FramedBytes(const google::protobuf::MessageLite& message) { return message.ByteSizeLong() + 5; }

}  // namespace amaq
