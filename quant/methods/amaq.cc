#include "quant/methods/amaq.h"

#include <cstdio>

#include "quant/amaq_quantizer.h"
#include "quant/tensor_codec.h"

namespace amaq::quant {
namespace {

constexpr double kDefaultBmax = 8, kDefaultBmin = 3;  // "amaq" alone

class AmaqClientCodec : public ClientCodec {
 public:
  AmaqClientCodec(int64_t channels, AmaqOptions options) : quantizer_(channels, options), gates_(channels) {}

  Encoded EncodeTraining(const torch::Tensor& x, const SampleRows& samples, torch::Tensor* upstream) override {
    pending_.Put(samples.step, samples.part,
                 {x.detach().to(torch::kCPU, torch::kFloat).contiguous(), quantizer_.IntegerBits(x.size(0))});
    Encoded e;
    *upstream = quantizer_.Quantize(x, activation_stream_, &e);
    return e;
  }
  std::vector<uint8_t> EncodeTrainingAgain(int64_t step, int part) override {
    const Pending& p = pending_.At(step, part);
    return EncodeTensor(activation_stream_, p.x, p.bits, quantizer_.WireOptions()).bytes;
  }
  std::vector<uint8_t> EncodeEvaluation(const torch::Tensor& x) const override {
    Encoder stateless;  // evaluation messages always carry their bits table
    return EncodeTensor(stateless, x, quantizer_.IntegerBits(x.size(0)), quantizer_.WireOptions()).bytes;
  }
  void Step() override {
    quantizer_.Regularizer().backward();
    quantizer_.Step();
  }
  std::vector<uint8_t> GateBits() const override { return quantizer_.IntegerBits(gates_).bits; }
  void Save(torch::serialize::OutputArchive& archive) override {
    archive.write("amaq.gates", quantizer_.gates());
    torch::serialize::OutputArchive optimizer;
    quantizer_.optimizer().save(optimizer);
    archive.write("amaq.optimizer", optimizer);
  }
  void Load(torch::serialize::InputArchive& archive, int64_t next_step) override {
    torch::NoGradGuard no_grad;
    torch::Tensor gates;
    archive.read("amaq.gates", gates);
    quantizer_.gates().copy_(gates);
    torch::serialize::InputArchive optimizer;
    archive.read("amaq.optimizer", optimizer);
    quantizer_.optimizer().load(optimizer);
    quantizer_.set_step(next_step);
  }

 private:
  AmaqQuantizer quantizer_;
  struct Pending {
    torch::Tensor x;  // fp32 CPU copy of a training activation
    BitsTable bits;   // its widths
  };
  StepParts<Pending> pending_;
  int64_t gates_;
};

class AmaqServerCodec : public ServerCodec {
 public:
  explicit AmaqServerCodec(std::optional<GradientSpec> gradient) : gradient_(gradient) {}

 protected:
  GradientFormat GradientFor(const Decoded& activation) const override {
    if (gradient_) return gradient_->Format();
    GradientFormat f;  // the activation's own widths and granularity
    f.options.scheme = Scheme::kAffine;
    f.options.granularity = activation.granularity;
    f.bits = activation.bits;
    return f;
  }

 private:
  std::optional<GradientSpec> gradient_;
};

class Amaq : public Method {
 public:
  Amaq(double bmax, double bmin, std::optional<double> budget, bool uniform, std::optional<GradientSpec> gradient)
      : bmax_(bmax), bmin_(bmin), budget_(budget), uniform_(uniform), gradient_(gradient) {}

  std::string ToString() const override {
    char buf[64];
    if (budget_ && bmax_ == kDefaultBmax && bmin_ == kDefaultBmin) {
      std::snprintf(buf, sizeof buf, "amaq:budget=%g", *budget_);
    } else if (budget_) {  // the range is part of the method: 8->2 leaves the allocation room below the budget
      std::snprintf(buf, sizeof buf, "amaq:%g->%g:budget=%g", bmax_, bmin_, *budget_);
    } else {
      std::snprintf(buf, sizeof buf, "amaq:%g->%g", bmax_, bmin_);
    }
    return std::string(buf) + (uniform_ ? ":uniform" : "") + GradientSuffix(gradient_);
  }
  std::unique_ptr<ClientCodec> MakeClientCodec(const CodecContext& context) const override {
    AmaqOptions a;
    a.bmax = bmax_;
    a.bmin = bmin_;
    const MethodSettings& settings = context.settings;
    a.alpha = settings.Number("amaq_alpha");
    a.beta = settings.Number("amaq_beta");
    a.gate_lr = settings.Number("amaq_gate_lr");
    a.warmup_steps = settings.Integer("amaq_warmup");
    if (budget_) {
      a.budget = BitBudgetOptions{*budget_, context.steps, a.warmup_steps, settings.Number("amaq_ramp_fraction")};
    }
    a.uniform = uniform_;
    return std::make_unique<AmaqClientCodec>(context.channels, a);
  }
  std::unique_ptr<ServerCodec> MakeServerCodec(const CodecContext&) const override {
    return std::make_unique<AmaqServerCodec>(gradient_);
  }
  std::optional<double> target_bits() const override { return budget_; }

 private:
  double bmax_, bmin_;
  std::optional<double> budget_;
  bool uniform_;
  std::optional<GradientSpec> gradient_;
};

std::unique_ptr<Method> ParseAmaq(const MethodName& name) {
  if (name.arguments.size() > 3) name.Refuse("amaq takes a range, a budget, then optionally uniform");
  double bmax = kDefaultBmax, bmin = kDefaultBmin;
  std::optional<double> budget;
  bool uniform = false, range = false;
  for (const std::string& arg : name.arguments) {
    const size_t arrow = arg.find("->");
    if (arg.rfind("budget=", 0) == 0) {
      if (budget) name.Refuse("amaq takes one budget");
      budget = name.Number(arg.substr(7));
    } else if (arg == "uniform") {
      if (uniform) name.Refuse("amaq takes uniform once");
      uniform = true;
    } else if (arrow != std::string::npos) {
      if (range) name.Refuse("amaq takes one range");
      range = true;
      bmax = name.Number(arg.substr(0, arrow));
      bmin = name.Number(arg.substr(arrow + 2));
    } else {
      name.Refuse("'" + arg + "' is neither <bmax>-><bmin>, budget=<bits> nor uniform");
    }
  }
  if (uniform && !budget) name.Refuse("uniform widths follow a budget's schedule: amaq:budget=<bits>:uniform");
  if (!(bmin >= kMinBits && bmax <= kMaxBits && bmin < bmax)) name.Refuse("AMAQ needs 1 <= bmin < bmax <= 8");
  if (budget && !(*budget >= bmin && *budget <= bmax)) name.Refuse("the budget must lie between bmin and bmax");
  return std::make_unique<Amaq>(bmax, bmin, budget, uniform, name.gradient);
}

}  // namespace

MethodRegistration AmaqMethod() {
  using Kind = MethodSetting::Kind;
  return {{"amaq"},
          ParseAmaq,
          "amaq[:<bmax>-><bmin>] | amaq[:<bmax>-><bmin>]:budget=<b>[:uniform]",
          {{"`amaq[:<bmax>-><bmin>]`", "AMAQ with learned per-channel widths (default 8->3); `amaq_alpha`, `amaq_beta`, "
                                       "`amaq_gate_lr`, `amaq_warmup` tune it"},
           {"`amaq:budget=<b>`", "AMAQ allocated to a schedule from 8 bits down to an average of exactly b bits (reached "
                                 "after `amaq_warmup` + `amaq_ramp_fraction` of the remaining `steps`, then held); the gates "
                                 "choose which channels are wide"},
           {"`amaq:budget=<b>:uniform`", "the control: every channel at the schedule's width (the first ones a bit wider "
                                         "where the average falls between widths); no learned allocation"}},
          {{"amaq_alpha", Kind::kNumber, "AMAQ gate sharpness alpha", 1e-6, 1e6, 1.0},
           {"amaq_beta", Kind::kNumber, "AMAQ bit-regularizer weight beta", 0, 1e6, 0.01},
           {"amaq_gate_lr", Kind::kNumber, "AMAQ gates' Adam learning rate", 1e-9, 100, 0.01},
           {"amaq_warmup", Kind::kInteger, "AMAQ steps at bmax before the regularizer (or the budget's descent) starts", 0,
            MethodSetting::kUnbounded, 0},
           {"amaq_ramp_fraction", Kind::kNumber,
            "AMAQ budget: share of the steps after the warm-up spent descending to the target", 0.01, 1, 0.5}}};
}

}  // namespace amaq::quant
