#include "quant/methods/float_cast.h"

namespace amaq::quant {
namespace {

EncodeOptions CastOptions(Scheme scheme) {
  EncodeOptions o;
  o.scheme = scheme;
  return o;
}

class FloatCastServerCodec : public ServerCodec {
 public:
  explicit FloatCastServerCodec(Scheme scheme) : scheme_(scheme) {}

 protected:
  GradientFormat GradientFor(const Decoded&) const override { return GradientFormat{CastOptions(scheme_), {}}; }

 private:
  Scheme scheme_;
};

class FloatCast : public Method {
 public:
  explicit FloatCast(Scheme scheme) : scheme_(scheme) {}
  std::string ToString() const override { return quant::ToString(scheme_); }
  std::unique_ptr<ClientCodec> MakeClientCodec(const CodecContext&) const override {
    return std::make_unique<PlainClientCodec>(CastOptions(scheme_), BitsTable{});
  }
  std::unique_ptr<ServerCodec> MakeServerCodec(const CodecContext&) const override {
    return std::make_unique<FloatCastServerCodec>(scheme_);
  }

 private:
  Scheme scheme_;
};

std::unique_ptr<Method> ParseFloatCast(const MethodName& name) {
  if (name.gradient) name.Refuse("float methods send gradients as they send activations; grad= is for quantized ones");
  if (!name.arguments.empty()) name.Refuse("a float cast takes no arguments");
  return std::make_unique<FloatCast>(name.name == "bf16"   ? Scheme::kBFloat16
                                     : name.name == "fp16" ? Scheme::kFloat16
                                                           : Scheme::kFloat32);
}

}  // namespace

MethodRegistration FloatCastMethod() {
  return {{"fp32", "none", "bf16", "fp16"},
          ParseFloatCast,
          "fp32 | bf16 | fp16",
          {{"`fp32`", "activations and gradients as IEEE fp32 (no compression; the reference)"},
           {"`bf16`, `fp16`", "16-bit casts"}},
          {}};
}

}  // namespace amaq::quant
