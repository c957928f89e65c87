// SetComputeThreads: how many CPU threads LibTorch's kernels may use. Debian's LibTorch runs its
// fp32 matrix products in OpenBLAS, whose own thread pool ignores torch::set_num_threads and
// starts one thread per core; several amaq processes on one machine then oversubscribe the cores
// and spin (measured: a 2-thread step 14x slower next to a busy process). This sets both.
#pragma once

namespace amaq {

// n <= 0: every core.
void SetComputeThreads(int n);

}  // namespace amaq
