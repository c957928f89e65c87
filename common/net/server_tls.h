// ServerTlsContext: the OpenSSL context of a TLS endpoint the server serves itself through
// Boost.Asio (the front door in front of gRPC, the metrics port), from PEM files: TLS 1.2 or
// later, the certificate chain and key of `files`, and with `files.ca` set, mutual TLS (a client
// without a certificate that CA signed fails the handshake). With `http2`, the handshake selects
// HTTP/2 by ALPN (and fails for a client that does not offer it), as gRPC clients require. The context is immutable once made and may be
// shared by every connection; it lives as long as its last holder.
#pragma once

#include <boost/asio/ssl/context.hpp>

#include <memory>
#include <string>
#include <vector>

#include "common/net/tls_files.h"

namespace amaq {

// `what` names the endpoint in errors ("the front door", "metrics"). Throws amaq::Error:
// kNotFound for a missing file, kInvalidArgument for one that is not PEM or a key that is not the
// certificate's.
std::shared_ptr<boost::asio::ssl::context> ServerTlsContext(const TlsFiles& files, bool http2, const std::string& what);

// The identities of a verified peer certificate: its subject's common name and every DNS, URI,
// e-mail and IP subject alternative name, as gRPC's x509_common_name and
// x509_subject_alternative_name properties hold them. Empty when `ssl` has no peer certificate.
std::vector<std::string> PeerCertificateNames(const SSL* ssl);

}  // namespace amaq
