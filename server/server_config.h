// The settings of amaq-server: every key, its type, default, range and help (docs/configuration.md
// is generated from Help() and a test keeps the two equal).
#pragma once

#include "common/config.h"

namespace amaq::server {

Config ServerConfig();

}  // namespace amaq::server
