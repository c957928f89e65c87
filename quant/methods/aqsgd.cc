#include "quant/methods/aqsgd.h"

#include <filesystem>

#include "common/base/env.h"
#include "common/base/error.h"
#include "quant/aqsgd.h"
#include "quant/tensor_codec.h"

namespace amaq::quant {
namespace {

EncodeOptions Bf16() {
  EncodeOptions o;
  o.scheme = Scheme::kBFloat16;
  return o;
}

void SaveCache(ActivationCache& cache, const std::string& file, Env& env) {
  if (file.empty() || !cache.changed()) return;
  env.CreateDirs(std::filesystem::path(file).parent_path().string());
  cache.Save(file);
}

void LoadCache(ActivationCache& cache, const std::string& file, Env& env) {
  if (!file.empty() && env.FileExists(file)) cache.Load(file);
}

class AqsgdClientCodec : public ClientCodec {
 public:
  AqsgdClientCodec(const AqsgdOptions& options, std::string history_file)
      : sender_(options), history_file_(std::move(history_file)), env_(*options.env) {}

  Encoded EncodeTraining(const torch::Tensor& x, const SampleRows& samples, torch::Tensor* upstream) override {
    if (refused_) {
      full_step_ = samples.step;
      refused_ = false;
    }
    const torch::Tensor cpu = x.detach().to(torch::kCPU, torch::kFloat).contiguous();
    pending_.Put(samples.step, samples.part,
                 sender_.Encode(cpu.data_ptr<float>(), samples.ids, samples.tokens, x.size(1), nullptr,
                                samples.step == full_step_));
    *upstream = x;
    return pending_.At(samples.step, samples.part);
  }
  // Frames are self-contained: the same bytes are valid on a fresh stream.
  std::vector<uint8_t> EncodeTrainingAgain(int64_t step, int part) override { return pending_.At(step, part).bytes; }
  std::vector<uint8_t> EncodeEvaluation(const torch::Tensor& x) const override {
    Encoder stateless;  // evaluation samples have no AQ-SGD history
    return EncodeTensor(stateless, x, BitsTable{}, Bf16()).bytes;
  }
  bool fixed_tokens() const override { return true; }
  void ForgetHistory() override { refused_ = true; }
  void SaveHistory() override { SaveCache(sender_.cache(), history_file_, env_); }
  void LoadHistory() override { LoadCache(sender_.cache(), history_file_, env_); }

 private:
  AqsgdSender sender_;
  std::string history_file_;
  Env& env_;
  bool refused_ = false;    // the server refused a frame: the next step goes in full
  int64_t full_step_ = -1;  // the step whose parts go in full
  StepParts<Encoded> pending_;
};

class AqsgdServerCodec : public ServerCodec {
 public:
  AqsgdServerCodec(const AqsgdOptions& options, GradientFormat gradient, std::string history_file)
      : receiver_(options), gradient_(std::move(gradient)), history_file_(std::move(history_file)), env_(*options.env) {}

  Activation DecodeTraining(const uint8_t* data, size_t size, const SampleRows& samples, int64_t channels) override {
    Require(static_cast<int64_t>(samples.ids.size()) == samples.samples, ErrorCode::kInvalidArgument,
            "AQ-SGD steps need one sample id per sequence: send the batch's sample ids");
    AqsgdDecoded d = receiver_.Decode(data, size, samples.tokens, channels, samples.samples);
    Require(d.ids == samples.ids, ErrorCode::kInvalidArgument, "the AQ-SGD frame's sample ids differ from the step's");
    AnswerWith(gradient_);
    const double bits = d.values.empty() ? 0 : 8.0 * static_cast<double>(d.count.payload) / static_cast<double>(d.values.size());
    return Activation{std::move(d.values), bits, d.count};
  }

  void SaveHistory() override { SaveCache(receiver_.cache(), history_file_, env_); }
  void LoadHistory() override { LoadCache(receiver_.cache(), history_file_, env_); }
  uint64_t memory_bytes() const override { return receiver_.cache_stats().memory_bytes; }

 protected:
  GradientFormat GradientFor(const Decoded&) const override { return gradient_; }

 private:
  AqsgdReceiver receiver_;
  GradientFormat gradient_;
  std::string history_file_;
  Env& env_;
};

class Aqsgd : public Method {
 public:
  Aqsgd(int bits, std::optional<GradientSpec> gradient) : bits_(bits), gradient_(gradient) {}
  std::string ToString() const override { return "aqsgd:" + std::to_string(bits_) + GradientSuffix(gradient_); }
  std::unique_ptr<ClientCodec> MakeClientCodec(const CodecContext& context) const override {
    return std::make_unique<AqsgdClientCodec>(Options(context), HistoryFile(context));
  }
  std::unique_ptr<ServerCodec> MakeServerCodec(const CodecContext& context) const override {
    return std::make_unique<AqsgdServerCodec>(Options(context), gradient_.value_or(GradientSpec{}).Format(),
                                              HistoryFile(context));
  }

 private:
  AqsgdOptions Options(const CodecContext& context) const {
    AqsgdOptions o;
    o.bits = bits_;
    o.cache_memory_bytes = static_cast<uint64_t>(context.settings.Integer("aqsgd_cache_mb")) << 20;
    o.spill_dir = context.settings.Text("aqsgd_spill_dir");
    if (!o.spill_dir.empty() && !context.instance.empty()) o.spill_dir += "/" + context.instance;
    o.env = context.env;
    return o;
  }
  static std::string HistoryFile(const CodecContext& context) {
    return context.history_stem.empty() ? "" : context.history_stem + ".aqsgd";
  }

  int bits_;
  std::optional<GradientSpec> gradient_;
};

std::unique_ptr<Method> ParseAqsgd(const MethodName& name) {
  if (name.arguments.size() != 1) name.Refuse("aqsgd takes the bits of its deltas");
  return std::make_unique<Aqsgd>(name.Bits(name.arguments[0], 2), name.gradient);
}

}  // namespace

MethodRegistration AqsgdMethod() {
  using Kind = MethodSetting::Kind;
  const unsigned both = MethodSetting::kClient | MethodSetting::kServer;
  return {{"aqsgd"},
          ParseAqsgd,
          "aqsgd:<b>",
          {{"`aqsgd:<b>`", "AQ-SGD: first visit of a sample in bf16, later b-bit deltas against the cached activation; "
                           "`aqsgd_cache_mb` and `aqsgd_spill_dir` bound its cache"}},
          {{"aqsgd_cache_mb", Kind::kInteger, "memory of the AQ-SGD cache before spilling (on the server: each client's)", 1,
            1 << 20, 1024, "", both},
           {"aqsgd_spill_dir", Kind::kText,
            "where the AQ-SGD cache spills (on the server: a folder per client in it; empty: the memory limit is hard)", 0,
            0, 0, "", both}}};
}

}  // namespace amaq::quant
