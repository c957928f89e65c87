#include "quant/cut_codec.h"

#include <string>

#include "common/base/error.h"
#include "quant/tensor_codec.h"

namespace amaq::quant {
namespace {

double AverageBits(const Decoded& d) {
  if (d.bits.bits.empty()) return d.scheme == Scheme::kFloat32 ? 32 : 16;
  return d.bits.AverageBits(d.rows, d.cols);
}

// The share of elements at each width: a per-channel table's entries each stand for 1/cols of
// them, a per-token table's for 1/rows.
std::map<int, double> WidthShares(const Decoded& d) {
  if (d.bits.bits.empty()) return {{d.scheme == Scheme::kFloat32 ? 32 : 16, 1.0}};
  std::map<int, double> shares;
  const double each = 1.0 / static_cast<double>(d.bits.bits.size());
  for (const uint8_t b : d.bits.bits) shares[b] += each;
  return shares;
}

ServerCodec::Activation ActivationOf(Decoded& d) {
  return ServerCodec::Activation{std::move(d.values), AverageBits(d), d.count, WidthShares(d)};
}

}  // namespace

torch::Tensor ClientCodec::DecodeGradient(const std::vector<uint8_t>& message, int64_t rows, int64_t cols,
                                          ByteCount* count) {
  Decoded d;
  try {
    gradient_stream_.Decode(message.data(), message.size(), &d, ExpectedShape{rows, cols});
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    throw Error(ErrorCode::kDataLoss, std::string("the server's gradient does not fit this step (") + e.what() +
                                          "): the server and client disagree; update both and rejoin");
  }
  *count = d.count;
  auto* values = new std::vector<float>(std::move(d.values));
  return torch::from_blob(values->data(), {rows, cols}, [values](void*) { delete values; }, torch::kFloat);
}

void ClientCodec::Reset() {
  activation_stream_.Reset();
  gradient_stream_.Reset();
}

ServerCodec::Activation ServerCodec::DecodeTraining(const uint8_t* data, size_t size, const SampleRows& samples,
                                                    int64_t channels) {
  Decoded d;
  activation_stream_.Decode(data, size, &d,
                            ExpectedShape{samples.rows(), channels});
  AnswerWith(GradientFor(d));
  return ActivationOf(d);
}

ServerCodec::Activation ServerCodec::DecodeEvaluation(const uint8_t* data, size_t size, int64_t rows,
                                                      int64_t channels) const {
  Decoder stateless;  // evaluation messages carry their own bits tables
  Decoded d;
  stateless.Decode(data, size, &d, ExpectedShape{rows, channels});
  return ActivationOf(d);
}

Encoded ServerCodec::EncodeGradient(const float* gradient, int64_t rows, int64_t cols) {
  EncodeOptions options = gradient_format_.options;
  options.seed = ++gradients_encoded_ * 0xd1b54a32d192ed03ull;  // stochastic rounding: new noise each message
  return gradient_stream_.Encode(gradient, rows, cols, gradient_format_.bits, options);
}

void ServerCodec::Reset() {
  activation_stream_.Reset();
  gradient_stream_.Reset();
}

Encoded PlainClientCodec::EncodeTraining(const torch::Tensor& x, const SampleRows& samples, torch::Tensor* upstream) {
  pending_.Put(samples.step, samples.part, x.detach().to(torch::kCPU, torch::kFloat).contiguous());
  *upstream = x;
  return EncodeTensor(activation_stream_, pending_.At(samples.step, samples.part), bits_, options_);
}

std::vector<uint8_t> PlainClientCodec::EncodeTrainingAgain(int64_t step, int part) {
  return EncodeTensor(activation_stream_, pending_.At(step, part), bits_, options_).bytes;
}

std::vector<uint8_t> PlainClientCodec::EncodeEvaluation(const torch::Tensor& x) const {
  Encoder stateless;  // evaluation messages always carry their bits table
  return EncodeTensor(stateless, x, bits_, options_).bytes;
}

}  // namespace amaq::quant
