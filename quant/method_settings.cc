#include "quant/method_settings.h"

#include "common/base/error.h"
#include "quant/method.h"

namespace amaq::quant {
namespace {

// The registered declaration of `key`, which must be of `kind`'s family (a number or a text).
const MethodSetting& Declared(const std::string& key, bool text) {
  const MethodSetting* setting = FindMethodSetting(key);
  Require(setting != nullptr && (setting->kind == MethodSetting::Kind::kText) == text, ErrorCode::kInternal,
          "no method declares the " + std::string(text ? "text" : "number") + " setting '" + key +
              "': declare it where the method registers (quant/method.h)");
  return *setting;
}

}  // namespace

void MethodSettings::Set(const std::string& key, double number) {
  Declared(key, false);
  numbers_[key] = number;
}

void MethodSettings::Set(const std::string& key, const std::string& text) {
  Declared(key, true);
  texts_[key] = text;
}

double MethodSettings::Number(const std::string& key) const {
  const auto it = numbers_.find(key);
  return it != numbers_.end() ? it->second : Declared(key, false).default_number;
}

std::string MethodSettings::Text(const std::string& key) const {
  const auto it = texts_.find(key);
  return it != texts_.end() ? it->second : Declared(key, true).default_text;
}

}  // namespace amaq::quant
