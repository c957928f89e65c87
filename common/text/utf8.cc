#include "common/text/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <memory>

#include "common/base/error.h"

namespace amaq {
namespace {

// The empty pattern in UTF mode: matching it checks the subject's encoding.
const pcre2_code* Utf8Checker() {
  static const std::unique_ptr<pcre2_code, void (*)(pcre2_code*)> code = [] {
    int error = 0;
    PCRE2_SIZE at = 0;
    return std::unique_ptr<pcre2_code, void (*)(pcre2_code*)>(
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(""), 0, PCRE2_UTF, &error, &at, nullptr), pcre2_code_free);
  }();
  Require(code != nullptr, ErrorCode::kInternal, "PCRE2 cannot compile in UTF mode: reinstall libpcre2-8");
  return code.get();
}

}  // namespace

void RequireUtf8(const std::string& text, const std::string& where, const std::string& fix) {
  const pcre2_code* code = Utf8Checker();
  const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, match.get(), nullptr);
  if (rc > PCRE2_ERROR_UTF8_ERR1 || rc < PCRE2_ERROR_UTF8_ERR21) return;  // matched: the text is UTF-8
  const size_t at = pcre2_get_startchar(match.get());
  PCRE2_UCHAR reason[256];
  pcre2_get_error_message(rc, reason, sizeof reason);
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[at])));
  throw Error(ErrorCode::kInvalidArgument, where + ": byte " + std::to_string(at) + " (" + byte +
                                               ") begins no valid UTF-8 character (" +
                                               reinterpret_cast<const char*>(reason) + "): " + fix);
}

}  // namespace amaq
