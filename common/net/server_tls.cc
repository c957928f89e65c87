#include "common/net/server_tls.h"

#include <arpa/inet.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <filesystem>

#include "common/base/error.h"

namespace amaq {
namespace {

namespace ssl = boost::asio::ssl;

// HTTP/2 as ALPN names it (length-prefixed).
constexpr unsigned char kHttp2[] = {2, 'h', '2'};

// Chooses HTTP/2 when the client offers it, else ends the handshake: a gRPC client needs it selected.
int SelectHttp2(SSL*, const unsigned char** out, unsigned char* out_length, const unsigned char* offered,
                unsigned int offered_length, void*) {
  unsigned char* selected = nullptr;
  const int found = SSL_select_next_proto(&selected, out_length, kHttp2, sizeof(kHttp2), offered, offered_length);
  if (found != OPENSSL_NPN_NEGOTIATED) return SSL_TLSEXT_ERR_ALERT_FATAL;
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

std::string Text(const ASN1_STRING* s) {
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), static_cast<size_t>(ASN1_STRING_length(s)));
}

}  // namespace

std::shared_ptr<ssl::context> ServerTlsContext(const TlsFiles& files, bool http2, const std::string& what) {
  for (const std::string& file : {files.cert, files.key, files.ca}) {
    Require(file.empty() || std::filesystem::is_regular_file(file), ErrorCode::kNotFound,
            "cannot serve TLS on " + what + ": no file " + file + ": check the server's tls_cert, tls_key and tls_client_ca");
  }
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->set_options(ssl::context::no_sslv2 | ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  context->use_certificate_chain_file(files.cert, ec);
  if (!ec) context->use_private_key_file(files.key, ssl::context::pem, ec);
  Require(!ec, ErrorCode::kInvalidArgument,
          "cannot serve TLS on " + what + " with " + files.cert + " and " + files.key + " (" + ec.message() +
              "): give a PEM certificate chain and its private key");
  if (!files.ca.empty()) {
    context->load_verify_file(files.ca, ec);
    Require(!ec, ErrorCode::kInvalidArgument,
            "cannot verify client certificates on " + what + " with " + files.ca + " (" + ec.message() +
                "): give the PEM certificate of the CA that signs them (tls_client_ca)");
    context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  if (http2) SSL_CTX_set_alpn_select_cb(context->native_handle(), SelectHttp2, nullptr);
  return context;
}

std::vector<std::string> PeerCertificateNames(const SSL* ssl) {
  std::vector<std::string> names;
  X509* certificate = SSL_get1_peer_certificate(ssl);
  if (certificate == nullptr) return names;
  const X509_NAME* subject = X509_get_subject_name(certificate);
  for (int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(subject, NID_commonName, i)) {
    names.push_back(Text(X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i))));
  }
  auto* alternatives = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(certificate, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; alternatives != nullptr && i < sk_GENERAL_NAME_num(alternatives); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(alternatives, i);
    if (name->type == GEN_DNS || name->type == GEN_URI || name->type == GEN_EMAIL) {
      names.push_back(Text(name->d.ia5));
    } else if (name->type == GEN_IPADD) {
      char text[INET6_ADDRSTRLEN] = "";
      const int length = ASN1_STRING_length(name->d.ip);
      if (length == 4 || length == 16) inet_ntop(length == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(name->d.ip), text, sizeof(text));
      names.push_back(text);
    }
  }
  GENERAL_NAMES_free(alternatives);
  X509_free(certificate);
  return names;
}

}  // namespace amaq
