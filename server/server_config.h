// The settings of amaq-server: every key, its type, default, range and help (docs/configuration.md
// is generated from Help() and a test keeps the two equal), and the options they make. Keys that
// set an options field take their default from the struct (common/base/option_keys.h).
#pragma once

#include "common/base/config.h"
#include "server/grpc_service.h"
#include "server/replica_group.h"
#include "server/split_server.h"

namespace amaq::server {

Config ServerConfig();
ServerOptions ServerOptionsFrom(const Config& c);
ServiceOptions ServiceOptionsFrom(const Config& c);
ReplicaOptions ReplicaOptionsFrom(const Config& c);
// What --check_config validates beyond the keys: both options structs and the addresses.
void CheckServerConfig(const Config& c);

}  // namespace amaq::server
