// How freed memory goes back to the system. glibc serves allocations below a threshold that
// grows with what was freed (up to 32 MiB) from heaps it rarely shrinks, so a training step's
// freed activations (many 2-40 MiB tensors) stay in the process and the next step's land beside
// them: on a client part of TinyLlama's shapes that kept ~200 MiB more resident per step than the
// step needs (docs/benchmarks.md, "Memory of a client part"). Pinning the threshold at 1 MiB makes
// every larger tensor a mapping of its own, returned whole when freed, at the cost of a page fault
// per fresh page.
#pragma once

namespace amaq {

// Call once, early, in a process that must keep its peak resident memory low.
void ReturnLargeFreesToTheSystem();

}  // namespace amaq
