// ConnectionFaults: what a failed Join says about the connection to the server, turned into an
// error the user can act on. Faults that no retry cures (a certificate from another CA, a server
// name the certificate does not hold, mutual TLS without a client certificate) are
// kFailedPrecondition, so the client stops at once; the text names the server as the user gave it
// (not the local byte meter's address) and the setting to change.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/base/error.h"

namespace amaq::client {

// The permanent TLS fault in `status` (a failed Join to `server`, verifying `tls_name`), if any;
// only an UNAVAILABLE status (the transport's) is read.
std::optional<Error> PermanentTlsFault(const grpc::Status& status, const std::string& server, const std::string& tls_name);

// Whether host:port refuses a TCP connection (nothing listens there), by connecting directly, for
// at most `timeout_seconds`. False when it connects, times out or cannot resolve the host.
bool RefusesConnections(const std::string& host, uint16_t port, double timeout_seconds);

// Whether the TLS server at host:port asks for a client certificate (mutual TLS), by a handshake
// of its own that offers none (server name `tls_name`, the server's certificate not checked), for
// at most `timeout_seconds`. Under TLS 1.3 a server's refusal of a client without a certificate
// reaches gRPC only as "Socket closed"; this says why. False when the handshake cannot tell.
bool RequestsClientCertificate(const std::string& host, uint16_t port, const std::string& tls_name, double timeout_seconds);

}  // namespace amaq::client
