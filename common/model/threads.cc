#include "common/model/threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <thread>

namespace amaq {

void SetComputeThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set_blas(n);
}

}  // namespace amaq
