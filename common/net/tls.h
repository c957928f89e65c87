// TLS for the gRPC channel between clients and server, from PEM files (docs/configuration.md):
// the server presents cert + key and, for mutual TLS, verifies client certificates against
// client_ca; clients verify the server against ca and may present their own cert + key. Plain
// text exists only for tests that ask for it explicitly (insecure: true).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>

#include "common/net/tls_files.h"

namespace amaq {

// Throws amaq::Error (kNotFound / kInvalidArgument) naming the missing or unreadable file.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsFiles& files, bool insecure);
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsFiles& files, bool insecure);

}  // namespace amaq
