//===- rng.h - Counter-based random numbers (init, dropout) ----*- C++ -*-===//
//
// Parameters are initialized from a stateless generator indexed by the
// element's position in the *global* (unsharded) tensor. Any rank can
// therefore produce exactly its own slice, and a sharded run starts from
// bit-identical weights to the single-rank run of the same model and seed.
// Dropout masks are built the same way (format version 4), so a sharded
// dropout drops exactly the elements the unsharded one drops.
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

/// Tag mixed into the seed of dropout keys ("dropout!" in ASCII), so that
/// the dropout streams are unrelated to the token stream and generation's
/// sampler, which start from splitmix64(seed) and splitmix64(seed ^ tag).
constexpr uint64_t kDropoutTag = 0x64726f706f757421ull;

/// Tag of the random training windows' keys ("windows!"): row g of step t
/// starts at splitmix64(splitmix64(splitmix64(Seed ^ kWindowTag) + t) + g)
/// modulo (length - seq - 1).
constexpr uint64_t kWindowTag = 0x77696e646f777321ull;

/// Key of the dropout mask of (\p Seed, \p Stream, \p Step):
///   splitmix64(splitmix64(splitmix64(Seed ^ kDropoutTag) + Stream) + Step)
/// (64-bit wrap-around arithmetic; Stream is the plan's int64 taken modulo
/// 2^64).
inline uint64_t dropoutKey(uint64_t Seed, uint64_t Stream, uint64_t Step) {
  return splitmix64(splitmix64(splitmix64(Seed ^ kDropoutTag) + Stream) +
                    Step);
}

/// Uniform in [0, 1) of global element \p G of the mask with key \p Key:
/// the top 53 bits of splitmix64(Key + G) times 2^-53 (exact in a double).
inline double dropoutUniform(uint64_t Key, uint64_t G) {
  return double(splitmix64(Key + G) >> 11) * 0x1.0p-53;
}

} // namespace megac_rt

#endif // MEGAC_RT_RNG_H
