#include "common/base/memory.h"

#include <malloc.h>

namespace amaq {

void ReturnLargeFreesToTheSystem() {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // fixes the threshold: glibc stops raising it
}

}  // namespace amaq
