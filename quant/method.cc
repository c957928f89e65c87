#include "quant/method.h"

#include <map>
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
    "amaq:budget=<bits>[:uniform] or aqsgd:<bits>, each quantized one optionally ending in :grad=<bits>";

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

std::string GradientSuffix(std::optional<int> gradient_bits) {
  return gradient_bits ? ":grad=" + std::to_string(*gradient_bits) : "";
}

std::unique_ptr<Method> Method::Parse(const std::string& text) {
  MethodName name;
  name.text = text;
  std::stringstream ss(text);
  std::getline(ss, name.name, ':');
  for (std::string part; std::getline(ss, part, ':');) name.arguments.push_back(part);
  if (!name.arguments.empty() && name.arguments.back().rfind("grad=", 0) == 0) {
    name.gradient_bits = name.Bits(name.arguments.back().substr(5), 2);
    name.arguments.pop_back();
  }
  const auto parser = Parsers().find(name.name);
  if (text.empty() || parser == Parsers().end()) {
    throw Error(ErrorCode::kInvalidArgument, "unknown method '" + text + "': " + kForms);
  }
  return parser->second(name);
}

void RegisterMethod(const std::string& name, MethodParser parser) { Parsers()[name] = std::move(parser); }

}  // namespace amaq::quant
