#include "quant/method.h"

#include <map>
#include <set>
#include <sstream>

#include "common/base/error.h"
#include "quant/methods/amaq.h"
#include "quant/methods/aqsgd.h"
#include "quant/methods/fixed.h"
#include "quant/methods/float_cast.h"

namespace amaq::quant {
namespace {

constexpr char kForms[] =
    "use fp32, bf16, fp16, fixed:<bits>[:tensor|channel|token|group[:<size>]], amaq[:<bmax>-><bmin>], "
    "amaq[:<bmax>-><bmin>]:budget=<bits>[:uniform] or aqsgd:<bits>, each quantized one optionally ending in :grad=<bits>[:token][:symmetric][:stochastic]";

// The factory: one line per method.
std::map<std::string, MethodParser>& Parsers() {
  static std::map<std::string, MethodParser> parsers = {
      {"fp32", ParseFloatCast}, {"none", ParseFloatCast}, {"bf16", ParseFloatCast}, {"fp16", ParseFloatCast},
      {"fixed", ParseFixed},
      {"amaq", ParseAmaq},
      {"aqsgd", ParseAqsgd},
  };
  return parsers;
}

// "<bits>[:token][:symmetric][:stochastic]" (options in any order, each once).
GradientSpec ParseGradient(const MethodName& name, const std::string& spec) {
  std::stringstream ss(spec);
  std::string part;
  std::getline(ss, part, ':');
  GradientSpec g;
  g.bits = name.Bits(part, 2);
  std::set<std::string> seen;
  while (std::getline(ss, part, ':')) {
    if (!seen.insert(part).second) name.Refuse("gradient option '" + part + "' is given twice");
    if (part == "token") {
      g.granularity = Granularity::kToken;
    } else if (part == "symmetric") {
      g.scheme = Scheme::kSymmetric;
    } else if (part == "stochastic") {
      g.rounding = Rounding::kStochastic;
    } else {
      name.Refuse("gradient option '" + part + "' is not token, symmetric or stochastic");
    }
  }
  return g;
}

}  // namespace

void MethodName::Refuse(const std::string& why) const {
  throw Error(ErrorCode::kInvalidArgument, "method '" + text + "': " + why + "; " + kForms);
}

double MethodName::Number(const std::string& argument) const {
  try {
    size_t used = 0;
    const double v = std::stod(argument, &used);
    if (used == argument.size()) return v;
  } catch (const std::exception&) {
  }
  Refuse("'" + argument + "' is not a number");
}

int MethodName::Bits(const std::string& argument, int low) const {
  const double v = Number(argument);
  if (v != static_cast<int>(v) || v < low || v > kMaxBits) {
    Refuse("bits must be an integer in " + std::to_string(low) + "..8, got " + argument);
  }
  return static_cast<int>(v);
}

std::string GradientSuffix(const std::optional<GradientSpec>& gradient) { return gradient ? gradient->ToString() : ""; }

std::unique_ptr<Method> Method::Parse(const std::string& text) {
  MethodName name;
  name.text = text;
  const size_t grad = text.find(":grad=");  // the gradient's part runs to the end
  std::stringstream ss(text.substr(0, grad));
  std::getline(ss, name.name, ':');
  for (std::string part; std::getline(ss, part, ':');) name.arguments.push_back(part);
  if (grad != std::string::npos) name.gradient = ParseGradient(name, text.substr(grad + 6));
  const auto parser = Parsers().find(name.name);
  if (text.empty() || parser == Parsers().end()) {
    throw Error(ErrorCode::kInvalidArgument, "unknown method '" + text + "': " + kForms);
  }
  return parser->second(name);
}

void RegisterMethod(const std::string& name, MethodParser parser) { Parsers()[name] = std::move(parser); }

}  // namespace amaq::quant
