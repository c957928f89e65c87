#include "quant/method.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "common/base/error.h"
#include "quant/methods/amaq.h"
#include "quant/methods/aqsgd.h"
#include "quant/methods/fixed.h"
#include "quant/methods/float_cast.h"

namespace amaq::quant {
namespace {

constexpr char kGradientGrammar[] = "a quantized one may end in :grad=<b>[:token][:symmetric][:stochastic]";

std::vector<MethodRegistration>& Registry() {
  static std::vector<MethodRegistration> registry = BuiltInMethods();
  return registry;
}

const MethodRegistration* Find(const std::string& name) {
  for (const MethodRegistration& r : Registry()) {
    if (std::find(r.names.begin(), r.names.end(), name) != r.names.end()) return &r;
  }
  return nullptr;
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

std::vector<MethodRegistration> BuiltInMethods() {
  return {FloatCastMethod(), FixedMethod(), AmaqMethod(), AqsgdMethod()};  // the factory: one line per method
}

const std::vector<MethodRegistration>& RegisteredMethods() { return Registry(); }

void RegisterMethod(MethodRegistration registration) {
  std::vector<MethodRegistration>& registry = Registry();
  const auto replaced = std::find_if(registry.begin(), registry.end(), [&](const MethodRegistration& r) {
    return std::find(r.names.begin(), r.names.end(), registration.names.front()) != r.names.end();
  });
  for (const MethodSetting& setting : registration.settings) {
    for (const MethodRegistration& other : registry) {
      const bool declares = std::any_of(other.settings.begin(), other.settings.end(),
                                        [&](const MethodSetting& s) { return s.key == setting.key; });
      Require(!declares || (replaced != registry.end() && &other == &*replaced), ErrorCode::kInternal,
              "method " + registration.names.front() + " declares setting " + setting.key + ", which method " +
                  other.names.front() + " declares already: name a method's settings after the method");
    }
  }
  if (replaced != registry.end()) {
    *replaced = std::move(registration);
  } else {
    registry.push_back(std::move(registration));
  }
}

std::string MethodGrammar() {
  std::string grammar;
  for (const MethodRegistration& r : Registry()) grammar += (grammar.empty() ? "" : " | ") + r.grammar;
  return grammar + "; " + kGradientGrammar;
}

std::string MethodTable(const std::vector<MethodRegistration>& methods) {
  std::string table = "| method | what crosses the cut |\n|---|---|\n";
  for (const MethodRegistration& r : methods) {
    for (const MethodRegistration::Row& row : r.rows) table += "| " + row.form + " | " + row.meaning + " |\n";
  }
  return table + "| `<quantized method>:grad=<b>[:token][:symmetric][:stochastic]` | e.g. `fixed:3:channel:grad=8`, "
                 "`amaq:budget=3:grad=8`: the gradients go back at a fixed b bits instead of the method's own widths; "
                 "scales per channel or per `token`, an affine grid over [min, max] or a `symmetric` one around 0 (zero "
                 "exact), rounding to nearest or `stochastic` (unbiased) (`docs/amaq.md`) |\n";
}

const MethodSetting* FindMethodSetting(const std::string& key) {
  for (const MethodRegistration& r : Registry()) {
    for (const MethodSetting& setting : r.settings) {
      if (setting.key == key) return &setting;
    }
  }
  return nullptr;
}

void MethodName::Refuse(const std::string& why) const {
  throw Error(ErrorCode::kInvalidArgument, "method '" + text + "': " + why + "; use " + MethodGrammar());
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
  const MethodRegistration* method = Find(name.name);
  if (text.empty() || method == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "unknown method '" + text + "': use " + MethodGrammar());
  }
  return method->parser(name);
}

}  // namespace amaq::quant
