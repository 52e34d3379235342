//===- rng.h - Counter-based random numbers for parameter init -*- C++ -*-===//
//
// Parameters are initialized from a stateless generator indexed by the
// element's position in the *global* (unsharded) tensor. Any rank can
// therefore produce exactly its own slice, and a sharded run starts from
// bit-identical weights to the single-rank run of the same model and seed.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_RNG_H
#define MEGAC_RT_RNG_H

#include <cmath>
#include <cstdint>
#include <string>

namespace megac_rt {

/// SplitMix64 finalizer applied to x + golden gamma (Steele et al.).
inline uint64_t splitmix64(uint64_t X) {
  uint64_t Z = X + 0x9e3779b97f4a7c15ull;
  Z = (Z ^ (Z >> 30)) * 0xbf58476d1ce4e5b9ull;
  Z = (Z ^ (Z >> 27)) * 0x94d049bb133111ebull;
  return Z ^ (Z >> 31);
}

/// 64-bit FNV-1a of a string.
inline uint64_t fnv1a64(const std::string &S) {
  uint64_t H = 0xcbf29ce484222325ull;
  for (unsigned char C : S) {
    H ^= C;
    H *= 0x100000001b3ull;
  }
  return H;
}

/// Per-parameter stream key.
inline uint64_t paramKey(const std::string &Name, uint64_t Seed) {
  return fnv1a64(Name) ^ splitmix64(Seed);
}

/// Maps 64 random bits to a double in (0, 1], so log() never sees 0.
inline double unitOpenClosed(uint64_t X) {
  return double((X >> 11) + 1) * 0x1.0p-53;
}

/// Standard normal sample number \p G of the stream \p Key (Box-Muller).
inline double normalAt(uint64_t Key, uint64_t G) {
  double U1 = unitOpenClosed(splitmix64(Key + 2 * G));
  double U2 = unitOpenClosed(splitmix64(Key + 2 * G + 1));
  return std::sqrt(-2.0 * std::log(U1)) * std::cos(6.283185307179586 * U2);
}

} // namespace megac_rt

#endif // MEGAC_RT_RNG_H
