// The settings of amaq-client: every key, its type, default, range and help (docs/configuration.md
// is generated from Help() and a test keeps the two equal).
#pragma once

#include "common/config.h"

namespace amaq::client {

Config ClientConfig();

}  // namespace amaq::client
