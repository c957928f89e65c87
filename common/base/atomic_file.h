// Writing files so that a crash never leaves a half-written one: the bytes go to a temporary file
// in the same directory, which is flushed to disk (sync) and then renamed over the target; the
// directory is synced too, where the file system can. Either the old file or the complete new one
// survives. Errors (disk full, no permission) throw amaq::Error, leave the old file untouched and
// remove the temporary one. Every file operation goes through `env` (common/base/env.h; not owned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/base/env.h"

namespace amaq {

// Appends bytes to the file being written.
using ByteSink = std::function<void(const void* data, size_t size)>;

// Writes to `path` atomically what `produce` passes to its sink, in order, so that a large file
// need not be in memory at once. An exception from `produce` leaves the old file and goes on.
void WriteFileAtomically(const std::string& path, const std::function<void(const ByteSink&)>& produce,
                         Env* env = Env::Default());

// Writes the concatenation of `parts` (pointer, size) to `path` atomically.
void WriteFileAtomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts,
                         Env* env = Env::Default());

inline void WriteFileAtomically(const std::string& path, const std::string& text, Env* env = Env::Default()) {
  WriteFileAtomically(path, {{text.data(), text.size()}}, env);
}

// Creates `dir` if needed and checks that files can be written in it, so that a program finds out
// at start, not at its first checkpoint. Throws amaq::Error naming `key` (the setting) and `dir`.
void RequireWritableDirectory(const std::string& dir, const std::string& key, Env* env = Env::Default());

}  // namespace amaq
