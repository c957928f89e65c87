// The two halves of a quantization method at the cut, one object per client on each side.
//
//   ClientCodec (on the client): encodes the activations it sends and decodes the gradients it
//     gets back; owns the activation stream (bits-table references), the method's own state
//     (AMAQ's gates, AQ-SGD's cache) and what it needs to send the last message again.
//   ServerCodec (on the server, one per session): decodes the activations and encodes the
//     gradients that answer them, in the format the method gives them; owns both streams.
//
// The trainers call these and never look at which method they hold; quant/method.h makes them.
// Streams: a (re)join calls Reset() on both sides, after which the next message of each stream
// carries its bits table in full. Evaluation messages are self-contained on every method.
// Neither class is thread-safe: each belongs to one client's steps, which run one at a time.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/base/env.h"
#include "common/base/error.h"
#include "quant/codec.h"
#include "quant/method_settings.h"

namespace amaq::quant {

// What a codec needs to know of the run beyond its method's own text: facts of the run, and the
// values of the method's own settings (quant/method_settings.h).
struct CodecContext {
  int64_t channels = 0;   // width of the cut (the model's hidden size)
  int64_t steps = 0;      // training steps of the run (schedules that end on the last step)
  MethodSettings settings;
  // Where SaveHistory and LoadHistory keep the method's history: a path to which the method adds
  // an extension of its own (empty: nowhere).
  std::string history_stem;
  // On the server, the name of this client's own folder in a directory that several clients'
  // codecs share (empty on a client, whose directories are its own).
  std::string instance;
  Env* env = Env::Default(); // the files of the codec's history and cache (not owned)
};

// The rows of a training activation: samples * tokens of them, sample after sample.
struct SampleRows {
  int64_t samples = 0;
  int64_t tokens = 0;
  std::vector<uint64_t> ids;  // the samples' ids (AQ-SGD keys its cache by them)
  int part = 0;               // which part of its step these rows are (StepInput::micro_batch)
  int64_t step = 0;           // the training step they belong to (StepInput::step_id)
  int64_t rows() const { return samples * tokens; }
};

// What a client codec keeps of its steps' parts, to encode them again after a reconnect: the parts
// of the last two steps it encoded (a one-step-stale client has two steps in flight). Part 0 starts
// a step and drops every step but the one before it; later parts come in order.
template <typename T>
class StepParts {
 public:
  void Put(int64_t step, int part, T value) {
    if (part == 0) {  // a new step, or this one afresh: keep the one before it only
      for (auto it = steps_.begin(); it != steps_.end();) {
        it = it->first == step - 1 ? std::next(it) : steps_.erase(it);
      }
      steps_[step];
    }
    const auto it = steps_.find(step);
    const size_t encoded = it == steps_.end() ? 0 : it->second.size();
    Require(it != steps_.end() && part == static_cast<int>(encoded), ErrorCode::kInternal,
            "part " + std::to_string(part) + " of step " + std::to_string(step) + " encoded after " +
                std::to_string(encoded) + " of its parts: encode a step's parts in order from 0");
    it->second.push_back(std::move(value));
  }
  const T& At(int64_t step, int part) const {
    const auto it = steps_.find(step);
    Require(it != steps_.end() && part >= 0 && part < static_cast<int>(it->second.size()), ErrorCode::kInternal,
            "part " + std::to_string(part) + " of step " + std::to_string(step) +
                " is not among the last two steps' parts encoded: encode it before sending it again");
    return it->second[static_cast<size_t>(part)];
  }

 private:
  std::map<int64_t, std::vector<T>> steps_;
};

class ClientCodec {
 public:
  virtual ~ClientCodec() = default;

  // Encodes a training activation x [rows, channels] (any device and dtype) of `samples`. Sets
  // *upstream to the tensor the gradient is backpropagated into (x, or a differentiable
  // reconstruction of it). Advances the activation stream.
  virtual Encoded EncodeTraining(const torch::Tensor& x, const SampleRows& samples, torch::Tensor* upstream) = 0;
  // Part `part` of step `step`'s training activation again, after Reset() (a reconnect): for the
  // fresh stream (parts already sent again on it come first). The last two steps encoded can be.
  virtual std::vector<uint8_t> EncodeTrainingAgain(int64_t step, int part) = 0;
  // An evaluation activation [rows, channels]: a self-contained message, no stream, no history.
  virtual std::vector<uint8_t> EncodeEvaluation(const torch::Tensor& x) const = 0;
  // The gradient has been backpropagated through the last *upstream: learned parts step.
  virtual void Step() {}
  // Whether every training batch must have the same number of tokens per sample.
  virtual bool fixed_tokens() const { return false; }
  // The server refused a message for what it builds on (it restarted, or lost a message): what
  // this codec sends next builds on nothing the server may lack (AQ-SGD: the next step's samples
  // go in full; the rest of its cache stays).
  virtual void ForgetHistory() {}
  // The method's history (AQ-SGD's cache) to and from CodecContext::history_stem, when the method
  // has one and the context names a place: saved with each checkpoint (rewritten only when it
  // changed), loaded when the run resumes. A history of any age is safe to load (quant/aqsgd.h).
  // Throw amaq::Error when they cannot (the file, or the codec, then stays as it was).
  virtual void SaveHistory() {}
  virtual void LoadHistory() {}
  // Integer width per learned gate (empty when the method learns none).
  virtual std::vector<uint8_t> GateBits() const { return {}; }
  // The codec's learned state in a client checkpoint (`next_step`: where the run resumes).
  virtual void Save(torch::serialize::OutputArchive& archive) { (void)archive; }
  virtual void Load(torch::serialize::InputArchive& archive, int64_t next_step) { (void)archive, (void)next_step; }

  // Decodes the gradient of the last training activation into an fp32 CPU tensor [rows, cols];
  // a message of another shape is refused (kDataLoss). `count` receives its bytes.
  torch::Tensor DecodeGradient(const std::vector<uint8_t>& message, int64_t rows, int64_t cols, ByteCount* count);
  // Fresh streams in both directions (a join or rejoin).
  void Reset();

 protected:
  Encoder activation_stream_;

 private:
  Decoder gradient_stream_;
};

// The format of a gradient: its codec options and widths.
struct GradientFormat {
  EncodeOptions options;
  BitsTable bits;
};

class ServerCodec {
 public:
  virtual ~ServerCodec() = default;

  struct Activation {
    std::vector<float> values;  // [samples * tokens, channels]
    double average_bits = 0;    // of the codes (32 or 16 for float casts)
    ByteCount count;
    std::map<int, double> width_shares;  // share of the elements at each bit-width (empty: not known)
  };
  // Decodes a training activation of `samples` (the step's shape; checked before decompressing),
  // advancing the stream; the next gradient answers it. Throws amaq::Error (kDataLoss,
  // kInvalidArgument, kFailedPrecondition as the codec does) leaving the stream as it was.
  virtual Activation DecodeTraining(const uint8_t* data, size_t size, const SampleRows& samples, int64_t channels);
  // A training activation whose answer comes from the server's store (a retry of it): read so that
  // the stream, and the format of the gradient that answers it, follow it as if it were decoded
  // for compute. AQ-SGD's caches take what the frame sets, once (quant/aqsgd.h).
  virtual void Reread(const uint8_t* data, size_t size, const SampleRows& samples, int64_t channels) {
    DecodeTraining(data, size, samples, channels);
  }
  // Decodes an evaluation activation of rows x channels (self-contained: no stream).
  Activation DecodeEvaluation(const uint8_t* data, size_t size, int64_t rows, int64_t channels) const;
  // Encodes the gradient [rows, cols] that answers the last training activation decoded.
  Encoded EncodeGradient(const float* gradient, int64_t rows, int64_t cols);
  // Fresh streams in both directions (a join or rejoin); a method's history (AQ-SGD) survives.
  void Reset();
  // As ClientCodec's: the method's history to and from CodecContext::history_stem.
  virtual void SaveHistory() {}
  virtual void LoadHistory() {}
  // Bytes the method's history holds in memory (AQ-SGD: its cache's entries not spilled).
  virtual uint64_t memory_bytes() const { return 0; }

 protected:
  // The gradient's format, given the training activation it answers.
  virtual GradientFormat GradientFor(const Decoded& activation) const = 0;
  // For codecs that decode training activations themselves: the format of the next gradient.
  void AnswerWith(GradientFormat format) { gradient_format_ = std::move(format); }

 private:
  Decoder activation_stream_;
  Encoder gradient_stream_;
  GradientFormat gradient_format_;
  uint64_t gradients_encoded_ = 0;  // seeds stochastic rounding (GradientSpec)
};

// The codecs of a method that sends every activation through the plain codec with one set of
// options and widths (float casts, fixed-bit methods); the server's half gives the gradient.
class PlainClientCodec : public ClientCodec {
 public:
  PlainClientCodec(EncodeOptions options, BitsTable bits) : options_(options), bits_(std::move(bits)) {}
  Encoded EncodeTraining(const torch::Tensor& x, const SampleRows& samples, torch::Tensor* upstream) override;
  std::vector<uint8_t> EncodeTrainingAgain(int64_t step, int part) override;
  std::vector<uint8_t> EncodeEvaluation(const torch::Tensor& x) const override;

 private:
  EncodeOptions options_;
  BitsTable bits_;
  StepParts<torch::Tensor> pending_;  // fp32 CPU copies of the steps' training activations
};

}  // namespace amaq::quant
