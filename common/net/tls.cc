#include "common/net/tls.h"

#include <fstream>
#include <sstream>

#include "common/base/error.h"

namespace amaq {
namespace {

std::string ReadPem(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  Require(in.good(), ErrorCode::kNotFound, path + ": cannot read the " + what + " (PEM): check the tls_* settings");
  std::stringstream text;
  text << in.rdbuf();
  Require(text.str().find("-----BEGIN") != std::string::npos, ErrorCode::kInvalidArgument,
          path + ": the " + what + " is not PEM text");
  return text.str();
}

}  // namespace

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsFiles& files, bool insecure) {
  if (insecure) return grpc::InsecureServerCredentials();
  Require(!files.cert.empty() && !files.key.empty(), ErrorCode::kInvalidArgument,
          "the server needs tls_cert and tls_key (or insecure: true for tests only)");
  grpc::SslServerCredentialsOptions options(files.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                             : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_key_cert_pairs.push_back({ReadPem(files.key, "private key"), ReadPem(files.cert, "certificate")});
  if (!files.ca.empty()) options.pem_root_certs = ReadPem(files.ca, "client CA");
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsFiles& files, bool insecure) {
  if (insecure) return grpc::InsecureChannelCredentials();
  Require(!files.ca.empty(), ErrorCode::kInvalidArgument,
          "the client needs tls_ca, the CA that signed the server's certificate (or insecure: true for tests only)");
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadPem(files.ca, "server CA");
  if (!files.cert.empty()) {
    options.pem_cert_chain = ReadPem(files.cert, "client certificate");
    options.pem_private_key = ReadPem(files.key, "client private key");
  }
  return grpc::SslCredentials(options);
}

}  // namespace amaq
