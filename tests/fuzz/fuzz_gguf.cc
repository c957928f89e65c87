// Fuzzes the GGUF reader (common/model/gguf.cc): GgufFile::Parse on untrusted bytes, then every
// tensor it accepts dequantized (those of up to 2^20 elements, to keep inputs fast). Any
// amaq::Error is an accepted answer; a crash, a sanitizer report or another exception is a bug.
#include <cstddef>
#include <cstdint>

#include "common/base/error.h"
#include "common/model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const amaq::GgufFile file = amaq::GgufFile::Parse(data, size, "fuzz.gguf");
    for (const amaq::GgufTensorInfo& tensor : file.tensors()) {
      if (tensor.elements <= (int64_t{1} << 20)) file.Dequantize(tensor);
    }
  } catch (const amaq::Error&) {
  }
  return 0;
}
