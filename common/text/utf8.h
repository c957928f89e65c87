// Whether text is UTF-8, by PCRE2's own check (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF). Stateless and thread-safe.
#pragma once

#include <string>

namespace amaq {

// Throws amaq::Error (kInvalidArgument) when `text` is not UTF-8: "<where>: byte N (0xE9) begins no
// valid UTF-8 character (<PCRE2's reason>): <fix>", N counting bytes of `text` from 0.
void RequireUtf8(const std::string& text, const std::string& where, const std::string& fix);

}  // namespace amaq
