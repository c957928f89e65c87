#include "quant/method.h"

#include <cstdio>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace amaq::quant {
namespace {

constexpr char kForms[] =
    "use fp32, bf16, fp16, fixed:<bits>[:tensor|channel|token|group[:<size>]], amaq[:<bmax>-><bmin>], "
    "amaq:budget=<bits>[:uniform] or aqsgd:<bits>, each quantized one optionally ending in :grad=<bits>";

std::vector<std::string> SplitColon(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ':');) parts.push_back(part);
  return parts;
}

double Number(const std::string& text, const std::string& method) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(ErrorCode::kInvalidArgument, "method '" + method + "': '" + text + "' is not a number: " + kForms);
}

int Bits(const std::string& text, const std::string& method, int low) {
  const double v = Number(text, method);
  Require(v == static_cast<int>(v) && v >= low && v <= kMaxBits, ErrorCode::kInvalidArgument,
          "method '" + method + "': bits must be an integer in " + std::to_string(low) + "..8, got " + text);
  return static_cast<int>(v);
}

}  // namespace

Method Method::Parse(const std::string& text) {
  Method m;
  std::vector<std::string> p = SplitColon(text);
  Require(!p.empty(), ErrorCode::kInvalidArgument, "method is empty: " + std::string(kForms));
  if (p.size() > 1 && p.back().rfind("grad=", 0) == 0) {  // any quantized method: fixed gradient widths
    Require(p[0] != "fp32" && p[0] != "bf16" && p[0] != "fp16", ErrorCode::kInvalidArgument,
            "method '" + text + "': float methods send gradients as they send activations; grad= is for quantized ones");
    m.gradient_bits = Bits(p.back().substr(5), text, 2);
    p.pop_back();
  }
  if (text == "fp32" || text == "none") {
    m.float_scheme = Scheme::kFloat32;
  } else if (text == "bf16") {
    m.float_scheme = Scheme::kBFloat16;
  } else if (text == "fp16") {
    m.float_scheme = Scheme::kFloat16;
  } else if (p[0] == "fixed" && (p.size() >= 2 && p.size() <= 4)) {
    m.kind = Kind::kFixed;
    m.bits = Bits(p[1], text, 1);
    if (p.size() >= 3) {
      const std::string& g = p[2];
      m.granularity = g == "tensor" ? Granularity::kTensor : g == "channel" ? Granularity::kChannel
                    : g == "token" ? Granularity::kToken : g == "group" ? Granularity::kGroup
                    : throw Error(ErrorCode::kInvalidArgument,
                                  "method '" + text + "': granularity '" + g + "' is not tensor, channel, token or group");
    }
    if (p.size() == 4) {
      Require(m.granularity == Granularity::kGroup, ErrorCode::kInvalidArgument,
              "method '" + text + "': only the group granularity takes a size");
      const double g = Number(p[3], text);
      Require(g >= 1 && g == static_cast<int>(g), ErrorCode::kInvalidArgument,
              "method '" + text + "': group size must be a positive integer");
      m.group_size = static_cast<int>(g);
    }
  } else if (p[0] == "amaq" && p.size() <= 3) {
    m.kind = Kind::kAmaq;
    for (size_t i = 1; i < p.size(); ++i) {
      const std::string& arg = p[i];
      const size_t arrow = arg.find("->");
      if (arg.rfind("budget=", 0) == 0) {
        m.budget = Number(arg.substr(7), text);
      } else if (arg == "uniform") {
        m.uniform = true;
      } else if (arrow != std::string::npos) {
        m.bmax = Number(arg.substr(0, arrow), text);
        m.bmin = Number(arg.substr(arrow + 2), text);
      } else {
        throw Error(ErrorCode::kInvalidArgument, "method '" + text + "': " + kForms);
      }
    }
    Require(!m.uniform || m.budget, ErrorCode::kInvalidArgument,
            "method '" + text + "': uniform widths follow a budget's schedule: amaq:budget=<bits>:uniform");
    Require(m.bmin >= kMinBits && m.bmax <= kMaxBits && m.bmin < m.bmax, ErrorCode::kInvalidArgument,
            "method '" + text + "': AMAQ needs 1 <= bmin < bmax <= 8");
    Require(!m.budget || (*m.budget >= m.bmin && *m.budget <= m.bmax), ErrorCode::kInvalidArgument,
            "method '" + text + "': the budget must lie between bmin and bmax");
  } else if (p[0] == "aqsgd" && p.size() == 2) {
    m.kind = Kind::kAqsgd;
    m.bits = Bits(p[1], text, 2);
  } else {
    throw Error(ErrorCode::kInvalidArgument, "unknown method '" + text + "': " + kForms);
  }
  return m;
}

std::string Method::ToString() const {
  char buf[64];
  switch (kind) {
    case Kind::kFloat: return quant::ToString(float_scheme);
    case Kind::kFixed: {
      const char* g = granularity == Granularity::kTensor ? "tensor" : granularity == Granularity::kChannel ? "channel"
                    : granularity == Granularity::kToken ? "token" : "group";
      std::snprintf(buf, sizeof buf, "fixed:%d:%s", bits, g);
      std::string s = buf;
      if (granularity == Granularity::kGroup) s += ":" + std::to_string(group_size);
      if (gradient_bits) s += ":grad=" + std::to_string(*gradient_bits);
      return s;
    }
    case Kind::kAmaq:
    {
      if (budget) {
        std::snprintf(buf, sizeof buf, "amaq:budget=%g", *budget);
      } else {
        std::snprintf(buf, sizeof buf, "amaq:%g->%g", bmax, bmin);
      }
      std::string s = buf;
      if (uniform) s += ":uniform";
      if (gradient_bits) s += ":grad=" + std::to_string(*gradient_bits);
      return s;
    }
    case Kind::kAqsgd: return "aqsgd:" + std::to_string(bits) + (gradient_bits ? ":grad=" + std::to_string(*gradient_bits) : "");
  }
  return "?";
}

EncodeOptions Method::ActivationOptions() const {
  EncodeOptions o;
  if (kind == Kind::kFloat) {
    o.scheme = float_scheme;
  } else {
    o.scheme = Scheme::kAffine;
    o.granularity = kind == Kind::kFixed ? granularity : Granularity::kChannel;
    o.group_size = group_size;
  }
  return o;
}

BitsTable Method::ActivationBits() const { return BitsTable::Uniform(kind == Kind::kFixed ? bits : 8); }

EncodeOptions Method::GradientOptions(const Decoded& activation) const {
  EncodeOptions o = ActivationOptions();
  if (kind == Kind::kAmaq) o.granularity = activation.granularity;
  if (kind == Kind::kAqsgd) o.granularity = Granularity::kChannel;
  return o;
}

BitsTable Method::GradientBits(const Decoded& activation) const {
  switch (kind) {
    case Kind::kAmaq:  // the same per-channel (or per-token) widths, or a fixed width
      return gradient_bits ? BitsTable::Uniform(*gradient_bits) : activation.bits;
    case Kind::kFixed: return BitsTable::Uniform(gradient_bits.value_or(bits));
    case Kind::kAqsgd: return BitsTable::Uniform(gradient_bits.value_or(8));
    case Kind::kFloat: return BitsTable{};
  }
  return BitsTable{};
}

}  // namespace amaq::quant
