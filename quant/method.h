// Method: how a run compresses what crosses the cut, as users name it (config key `method`). The
// forms (MethodGrammar() lists them; docs/configuration.md's table is MethodTable()):
//
//   fp32 | bf16 | fp16                          no compression (fp32) or a 16-bit cast
//   fixed:<bits>[:<granularity>[:<group>]]      fixed-bit affine, granularity tensor | channel |
//                                               token | group (default channel; group size 128)
//   amaq[:<bmax>-><bmin>][:budget=<bits>[:uniform]]  AMAQ (docs/amaq.md)
//   aqsgd:<bits>                                AQ-SGD with <bits>-bit deltas
//   <quantized method>:grad=<bits>[:token][:symmetric][:stochastic]
//                                               its gradients go back at a fixed width, with
//                                               those scales, grid and rounding (gradient_spec.h)
//
// A Method is the parsed, immutable name; it makes the codecs of both sides (quant/cut_codec.h).
// Each method is one file pair in quant/methods/ that returns its MethodRegistration (its names,
// parser, grammar, table rows and settings), and one line of the table in method.cc: adding one
// touches nothing else, its settings included (quant/method_settings.h).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quant/cut_codec.h"
#include "quant/gradient_spec.h"
#include "quant/method_settings.h"

namespace amaq::quant {

class Method {
 public:
  virtual ~Method() = default;

  // Parses a method name. Throws amaq::Error (kInvalidArgument) listing the allowed forms.
  static std::unique_ptr<Method> Parse(const std::string& text);

  // The canonical name: Parse(ToString()) gives an equal method.
  virtual std::string ToString() const = 0;
  virtual std::unique_ptr<ClientCodec> MakeClientCodec(const CodecContext& context) const = 0;
  virtual std::unique_ptr<ServerCodec> MakeServerCodec(const CodecContext& context) const = 0;
  // The average width the method aims at once trained (a budget), when it has one.
  virtual std::optional<double> target_bits() const { return std::nullopt; }
};

// A method name split for its parser: "fixed:4:group:grad=8" has name "fixed", arguments
// {"4", "group"} and a gradient of 8 bits.
struct MethodName {
  std::string text;                  // the whole name, for messages
  std::string name;
  std::vector<std::string> arguments;
  std::optional<GradientSpec> gradient;  // a trailing :grad=...

  // Throws amaq::Error (kInvalidArgument) saying what was wrong with `text` and the allowed forms.
  [[noreturn]] void Refuse(const std::string& why) const;
  double Number(const std::string& argument) const;
  // An integer in [low, 8].
  int Bits(const std::string& argument, int low) const;
};

// gradient->ToString() or "": how a method's ToString() ends.
std::string GradientSuffix(const std::optional<GradientSpec>& gradient);

// A method's parser: the method, or amaq::Error (kInvalidArgument) through name.Refuse.
using MethodParser = std::function<std::unique_ptr<Method>(const MethodName& name)>;

// What a method tells the registry of itself.
struct MethodRegistration {
  std::vector<std::string> names;  // the names it answers to ("fp32", "bf16", ...)
  MethodParser parser;
  std::string grammar;             // its forms, as --help and errors show them ("aqsgd:<b>")
  struct Row {                     // a row of docs/configuration.md's table of methods
    std::string form, meaning;
  };
  std::vector<Row> rows;
  std::vector<MethodSetting> settings;  // keys named after the method (amaq_gate_lr)
};

// Makes `registration` answer for its names, after the built-in methods (tests add their own
// methods this way); one registered before under its first name is replaced. A setting key that
// another method declares is refused (kInternal: keys are named after their method). Not
// thread-safe: register before any Parse, and before a program declares its keys (method_keys.h).
void RegisterMethod(MethodRegistration registration);
// The methods of the table in method.cc, then those registered later, in that order.
const std::vector<MethodRegistration>& RegisteredMethods();
// The methods of the table in method.cc alone (what docs/configuration.md documents).
std::vector<MethodRegistration> BuiltInMethods();
// Every method's forms and the gradient suffix, as --help and errors show them.
std::string MethodGrammar();
// The markdown table of `methods`' rows and the gradient suffix's.
std::string MethodTable(const std::vector<MethodRegistration>& methods);
// The setting declared as `key` by a registered method, or null.
const MethodSetting* FindMethodSetting(const std::string& key);

}  // namespace amaq::quant
