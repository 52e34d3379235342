//===- vocab_classes.h - A padded vocabulary's classes per block -*- C++ -*-===//
//
// One definition for the CPU kernels and the CUDA backend (host code and
// kernels, and the emulation, which compiles the kernels as host C++).
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_VOCAB_CLASSES_H
#define MEGAC_RT_VOCAB_CLASSES_H

#include <cstdint>

#if defined(__CUDACC__)
#define MEGAC_HOST_DEVICE __host__ __device__
#else
#define MEGAC_HOST_DEVICE
#endif

namespace megac_rt {

/// How many of a vocabulary block's \p Width logits, from id \p Start, are
/// classes: those below \p Classes (a padded vocabulary's class count; all
/// of them if Classes <= 0).
MEGAC_HOST_DEVICE inline int64_t classesInBlock(int64_t Start, int64_t Width,
                                                int64_t Classes) {
  if (Classes <= 0)
    return Width;
  return Classes <= Start ? 0 : Classes - Start < Width ? Classes - Start
                                                         : Width;
}

} // namespace megac_rt

#endif // MEGAC_RT_VOCAB_CLASSES_H
