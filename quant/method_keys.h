// The config keys of the registered methods' settings (quant/method_settings.h), for a program's
// Config: each setting whose sides include the program's, with its kind, default, help and range.
// In the form option_keys.h's Group takes: ClientOptions and ServerOptions hold a MethodSettings.
#pragma once

#include "common/base/config.h"
#include "quant/method_settings.h"

namespace amaq::quant {

void AddClientMethodKeys(Config& config, const MethodSettings& defaults);
MethodSettings ClientMethodSettingsFrom(const Config& config);
void AddServerMethodKeys(Config& config, const MethodSettings& defaults);
MethodSettings ServerMethodSettingsFrom(const Config& config);

}  // namespace amaq::quant
