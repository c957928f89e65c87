// TlsFiles: where one side of a TLS connection finds its PEM files (docs/configuration.md's tls_*
// keys). Plain data: nothing is read until a credential or context is made from it.
#pragma once

#include <string>

namespace amaq {

struct TlsFiles {
  std::string cert, key;  // this side's certificate chain and private key (client: optional)
  std::string ca;         // server: CA of client certificates (mutual TLS); client: CA of the server
};

}  // namespace amaq
