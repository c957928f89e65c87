#include "quant/method_keys.h"

#include <cstdint>
#include <limits>

#include "quant/method.h"

namespace amaq::quant {
namespace {

// An integer setting's bound as the Config takes it (a bound past int64's range is none).
int64_t IntegerBound(double bound) {
  constexpr double kLimit = 9.2e18;
  if (bound >= kLimit) return std::numeric_limits<int64_t>::max();
  if (bound <= -kLimit) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(bound);
}

void AddKeys(Config& config, const MethodSettings& defaults, unsigned side) {
  for (const MethodRegistration& method : RegisteredMethods()) {
    for (const MethodSetting& s : method.settings) {
      if (!(s.sides & side)) continue;
      switch (s.kind) {
        case MethodSetting::Kind::kNumber:
          config.AddDouble(s.key, defaults.Number(s.key), s.help, s.min, s.max);
          break;
        case MethodSetting::Kind::kInteger:
          config.AddInt(s.key, defaults.Integer(s.key), s.help, IntegerBound(s.min), IntegerBound(s.max));
          break;
        case MethodSetting::Kind::kText:
          config.AddString(s.key, defaults.Text(s.key), s.help);
          break;
      }
    }
  }
}

MethodSettings SettingsFrom(const Config& config, unsigned side) {
  MethodSettings settings;
  for (const MethodRegistration& method : RegisteredMethods()) {
    for (const MethodSetting& s : method.settings) {
      if (!(s.sides & side)) continue;
      switch (s.kind) {
        case MethodSetting::Kind::kNumber:
          settings.Set(s.key, config.Double(s.key));
          break;
        case MethodSetting::Kind::kInteger:
          settings.Set(s.key, static_cast<double>(config.Int(s.key)));
          break;
        case MethodSetting::Kind::kText:
          settings.Set(s.key, config.String(s.key));
          break;
      }
    }
  }
  return settings;
}

}  // namespace

void AddClientMethodKeys(Config& config, const MethodSettings& defaults) { AddKeys(config, defaults, MethodSetting::kClient); }
MethodSettings ClientMethodSettingsFrom(const Config& config) { return SettingsFrom(config, MethodSetting::kClient); }
void AddServerMethodKeys(Config& config, const MethodSettings& defaults) { AddKeys(config, defaults, MethodSetting::kServer); }
MethodSettings ServerMethodSettingsFrom(const Config& config) { return SettingsFrom(config, MethodSetting::kServer); }

}  // namespace amaq::quant
