// Method settings: the config keys a method reads besides its name (AMAQ's gate learning rate,
// AQ-SGD's cache size). A method declares them where it registers (quant/method.h), with their
// kind, range, default and which programs take them; amaq-client and amaq-server declare them as
// keys of their own (quant/method_keys.h) and hand the values to the codecs in
// CodecContext::settings. The trainers carry a MethodSettings without knowing any method: a key
// that was not set reads as its registered default.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>

namespace amaq::quant {

struct MethodSetting {
  enum class Kind { kNumber, kInteger, kText };
  enum Side : unsigned { kClient = 1, kServer = 2 };
  static constexpr double kUnbounded = std::numeric_limits<double>::infinity();  // a range without an end
  std::string key;             // the config key, named after its method (amaq_gate_lr)
  Kind kind = Kind::kNumber;
  std::string help;            // as --help shows it
  double min = 0, max = 0;     // the range of a number or an integer (kUnbounded: none)
  double default_number = 0;   // kNumber, kInteger
  std::string default_text;    // kText
  unsigned sides = kClient;    // the programs that take it: kClient, kServer or both
};

// Values of method settings by key. Reading a key no registered method declares (a typo in a
// method's own file) throws amaq::Error (kInternal).
class MethodSettings {
 public:
  void Set(const std::string& key, double number);
  void Set(const std::string& key, const std::string& text);
  double Number(const std::string& key) const;
  int64_t Integer(const std::string& key) const { return static_cast<int64_t>(Number(key)); }
  std::string Text(const std::string& key) const;

 private:
  std::map<std::string, double> numbers_;
  std::map<std::string, std::string> texts_;
};

}  // namespace amaq::quant
