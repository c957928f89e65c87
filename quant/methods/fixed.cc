#include "quant/methods/fixed.h"

#include <map>

namespace amaq::quant {
namespace {

const std::map<std::string, Granularity> kGranularities = {
    {"tensor", Granularity::kTensor}, {"channel", Granularity::kChannel},
    {"token", Granularity::kToken},   {"group", Granularity::kGroup}};

class FixedServerCodec : public ServerCodec {
 public:
  explicit FixedServerCodec(GradientFormat format) : format_(std::move(format)) {}

 protected:
  GradientFormat GradientFor(const Decoded&) const override { return format_; }

 private:
  GradientFormat format_;
};

class Fixed : public Method {
 public:
  Fixed(int bits, std::string granularity, int group_size, std::optional<GradientSpec> gradient)
      : bits_(bits), granularity_(std::move(granularity)), group_size_(group_size), gradient_(gradient) {
    options_.scheme = Scheme::kAffine;
    options_.granularity = kGranularities.at(granularity_);
    options_.group_size = group_size_;
  }
  std::string ToString() const override {
    std::string s = "fixed:" + std::to_string(bits_) + ":" + granularity_;
    if (options_.granularity == Granularity::kGroup) s += ":" + std::to_string(group_size_);
    return s + GradientSuffix(gradient_);
  }
  std::unique_ptr<ClientCodec> MakeClientCodec(const CodecContext&) const override {
    return std::make_unique<PlainClientCodec>(options_, BitsTable::Uniform(bits_));
  }
  std::unique_ptr<ServerCodec> MakeServerCodec(const CodecContext&) const override {
    return std::make_unique<FixedServerCodec>(gradient_ ? gradient_->Format() : GradientFormat{options_, BitsTable::Uniform(bits_)});
  }

 private:
  int bits_;
  std::string granularity_;
  int group_size_;
  std::optional<GradientSpec> gradient_;
  EncodeOptions options_;
};

std::unique_ptr<Method> ParseFixed(const MethodName& name) {
  const auto& a = name.arguments;
  if (a.empty() || a.size() > 3) name.Refuse("fixed takes bits, then optionally a granularity and a group size");
  const int bits = name.Bits(a[0], 1);
  const std::string granularity = a.size() >= 2 ? a[1] : "channel";
  if (!kGranularities.count(granularity)) name.Refuse("granularity '" + granularity + "' is not tensor, channel, token or group");
  int group_size = 128;
  if (a.size() == 3) {
    if (granularity != "group") name.Refuse("only the group granularity takes a size");
    const double g = name.Number(a[2]);
    if (g < 1 || g != static_cast<int>(g)) name.Refuse("group size must be a positive integer");
    group_size = static_cast<int>(g);
  }
  return std::make_unique<Fixed>(bits, granularity, group_size, name.gradient);
}

}  // namespace

MethodRegistration FixedMethod() {
  return {{"fixed"},
          ParseFixed,
          "fixed:<b>[:<granularity>[:<G>]]",
          {{"`fixed:<b>[:<granularity>[:<G>]]`", "fixed b-bit affine quantization, granularity `tensor`, `channel` "
                                                 "(default), `token` or `group` (G channels, default 128)"}},
          {}};
}

}  // namespace amaq::quant
