// A client's run: the words that define its experiment, so that a new run under a client_id never
// continues another run's stored state silently (docs/protocol.md, "Runs"). The server keeps them
// with the client's session and the client with its checkpoint; a Join or a checkpoint of another
// run is refused unless the client says resume (continue it) or fresh (discard it).
//
//   model=<fingerprint> cut=<layer> method=<canonical method> task=<data set name>
//   data=<XXH3 of the client's training examples> examples=<count> seed=<seed>
//   lora=r<rank>,a<alpha>,d<dropout>,<targets joined by +>
//
// Steps, learning rates, batch size and evaluation settings are not part of it: changing them
// continues the same run.
#pragma once

#include <string>

#include "client/split_client.h"
#include "common/text/datasets.h"

namespace amaq::client {

std::string RunIdentity(const ClientOptions& options, const std::string& model_fingerprint, const std::string& method,
                        const Dataset& data);

}  // namespace amaq::client
