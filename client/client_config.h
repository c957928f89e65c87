// The settings of amaq-client: every key, its type, default, range and help (docs/configuration.md
// is generated from Help() and a test keeps the two equal), and what they make: the training
// options, the connection's options and this client's share of the task's data (amaq-study builds
// its runs from them too). Keys that set an options field take their default from the struct
// (common/base/option_keys.h).
#pragma once

#include "client/grpc_transport.h"
#include "client/split_client.h"
#include "common/base/config.h"
#include "common/text/datasets.h"

namespace amaq::client {

// `program` names the keys' owner in --help and in messages (amaq-study builds on these keys).
Config ClientConfig(const std::string& program = "amaq-client");
// The SplitClient options the settings give.
ClientOptions ClientOptionsFrom(const Config& c);
// The connection's options (the token read from token_file when it is set; throws amaq::Error
// kNotFound when that file is missing).
GrpcOptions GrpcOptionsFrom(const Config& c);
// What --check_config validates beyond the keys: the options, the method and the server address
// (not the token, TLS or data files, which may live where the check does not run).
void CheckClientConfig(const Config& c);
// The task's data set with this client's shard of the training examples (shard_index,
// shard_count, max_train_examples). Throws amaq::Error (kNotFound) for missing data files.
Dataset LoadTask(const Config& c);

}  // namespace amaq::client
