#include "quant/method_keys.h"

#include <cstdint>
#include <limits>

#include "quant/method.h"

namespace amaq::quant {
namespace {

// An integer setting's bound as the Config takes it (MethodSetting::kUnbounded: int64's own).
int64_t IntegerBound(double bound) {
  constexpr double kInt64Range = 9223372036854775808.0;  // 2^63
  if (bound >= kInt64Range) return std::numeric_limits<int64_t>::max();
  if (bound <= -kInt64Range) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(bound);
}

// Calls `visit` with every registered setting that the program of `side` takes.
template <typename Visit>
void ForEachSetting(unsigned side, const Visit& visit) {
  for (const MethodRegistration& method : RegisteredMethods()) {
    for (const MethodSetting& s : method.settings) {
      if (s.sides & side) visit(s);
    }
  }
}

void AddKeys(Config& config, const MethodSettings& defaults, unsigned side) {
  ForEachSetting(side, [&](const MethodSetting& s) {
    switch (s.kind) {
      case MethodSetting::Kind::kNumber:
        return config.AddDouble(s.key, defaults.Number(s.key), s.help, s.min, s.max);
      case MethodSetting::Kind::kInteger:
        return config.AddInt(s.key, defaults.Integer(s.key), s.help, IntegerBound(s.min), IntegerBound(s.max));
      case MethodSetting::Kind::kText:
        return config.AddString(s.key, defaults.Text(s.key), s.help);
    }
  });
}

MethodSettings SettingsFrom(const Config& config, unsigned side) {
  MethodSettings settings;
  ForEachSetting(side, [&](const MethodSetting& s) {
    switch (s.kind) {
      case MethodSetting::Kind::kNumber:
        return settings.Set(s.key, config.Double(s.key));
      case MethodSetting::Kind::kInteger:
        return settings.Set(s.key, static_cast<double>(config.Int(s.key)));
      case MethodSetting::Kind::kText:
        return settings.Set(s.key, config.String(s.key));
    }
  });
  return settings;
}

}  // namespace

void AddClientMethodKeys(Config& config, const MethodSettings& defaults) { AddKeys(config, defaults, MethodSetting::kClient); }
MethodSettings ClientMethodSettingsFrom(const Config& config) { return SettingsFrom(config, MethodSetting::kClient); }
void AddServerMethodKeys(Config& config, const MethodSettings& defaults) { AddKeys(config, defaults, MethodSetting::kServer); }
MethodSettings ServerMethodSettingsFrom(const Config& config) { return SettingsFrom(config, MethodSetting::kServer); }

}  // namespace amaq::quant
