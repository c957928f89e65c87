// amaq's one error style (see docs/architecture.md, "Errors").
//
// Every failure that a caller can act on is thrown as amaq::Error: a code saying which kind of
// failure it is, and a message that says what went wrong and what the user should do about it.
// Boundaries (a gRPC handler, a CLI's main, a fuzzer) catch amaq::Error and turn it into a status,
// an exit code or a log line; nothing below them catches and hides it. Functions that parse
// untrusted bytes throw amaq::Error for every malformed input and never abort or read out of bounds.
#pragma once

#include <stdexcept>
#include <string>

namespace amaq {

enum class ErrorCode {
  kInvalidArgument,   // the caller passed something that can never work (bad config, bad shape)
  kDataLoss,          // bytes from outside are malformed or corrupted (codec, checkpoint files)
  kNotFound,          // a file, tensor, cache entry or key that should exist does not
  kFailedPrecondition,// the operation is valid but the state does not allow it yet
  kResourceExhausted, // a size, memory or rate limit would be exceeded
  kUnauthenticated,   // missing or wrong credentials
  kUnavailable,       // a transient failure: retrying may succeed
  kInternal,          // a bug in amaq: please report it
};

const char* ErrorCodeName(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(code, message) when `condition` is false. The message should name the offending
// value and say what to do, e.g. "bits must be in 1..8, got 9: pass --bits 1..8".
inline void Require(bool condition, ErrorCode code, const std::string& message) {
  if (!condition) throw Error(code, message);
}

// `text` as a message may quote it when it comes from outside: at most `max_chars` of it, and the
// size of the rest ("abc... (1048576 bytes)"), so that no input is echoed whole into a status.
std::string Excerpt(const std::string& text, size_t max_chars = 64);

}  // namespace amaq
