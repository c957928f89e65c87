#include "client/run_identity.h"

#include <cstdio>
#include <sstream>

#include "quant/checksum.h"

namespace amaq::client {
namespace {

// A value as one word: spaces (a user's file name) become underscores.
std::string Word(std::string value) {
  for (char& c : value) {
    if (c == ' ' || c == '\t' || c == '\n') c = '_';
  }
  return value.empty() ? "-" : value;
}

std::string TrainingDigest(const Dataset& data) {
  quant::WireChecksumStream digest;
  for (const Example& e : data.train) {
    digest.Update(e.prompt.data(), e.prompt.size() + 1);  // with its terminating NUL: a separator
    digest.Update(e.completion.data(), e.completion.size() + 1);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest.Digest()));
  return hex;
}

}  // namespace

std::string RunIdentity(const ClientOptions& options, const std::string& model_fingerprint, const std::string& method,
                        const Dataset& data) {
  std::ostringstream lora;
  lora << "r" << options.lora.rank << ",a" << options.lora.alpha << ",d" << options.lora.dropout << ",";
  for (size_t i = 0; i < options.lora.target_modules.size(); ++i) lora << (i ? "+" : "") << options.lora.target_modules[i];
  std::ostringstream run;
  run << "model=" << Word(model_fingerprint) << " cut=" << options.cut_layer << " method=" << Word(method)
      << " task=" << Word(data.name) << " data=" << TrainingDigest(data) << " examples=" << data.train.size()
      << " seed=" << options.seed << " lora=" << Word(lora.str());
  return run.str();
}

}  // namespace amaq::client
