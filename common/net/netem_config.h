// The settings of amaq-netem, the link emulator (common/tools/amaq_netem.cc): every key, its type,
// default, range and help (docs/configuration.md shows Help() and a test keeps the two equal).
#pragma once

#include "common/base/config.h"

namespace amaq {

Config NetemConfig();
// What --check_config validates beyond the keys: both addresses.
void CheckNetemConfig(const Config& c);

}  // namespace amaq
