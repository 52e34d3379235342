//===- init.h - Parameter initialization and input tokens -----*- C++ -*-===//
//
// Everything that fills buffers before the first instruction runs: seeded
// parameter init, loading a rank's slice of a HuggingFace checkpoint, and
// producing the token stream the "tokens"/"labels" inputs are cut from.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_INIT_H
#define MEGAC_RT_INIT_H

#include "safetensors.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace megac_rt {

using ShapeVec = std::vector<int64_t>;

enum class InitMode { Zeros, Ones, Normal };

/// Fills the slice (\p Local at \p Offset) of a \p Global-shaped parameter.
/// Normal values depend only on (Name, Seed, global element index), never on
/// how the parameter is sharded.
void initParamSlice(const std::string &Name, InitMode Mode, double Std,
                    const ShapeVec &Global, const ShapeVec &Offset,
                    const ShapeVec &Local, uint64_t Seed, float *Out);

/// Copies the slice (\p Local at \p Offset of \p Global) of parameter
/// \p Name out of tensor \p HfName (at \p HfOffset inside it) of \p Files (a
/// file, or the shard an index names), converting F16/BF16 to float. Accepts
/// the tensor name with or without a "transformer." prefix. A non-empty \p
/// HfShape (a padded vocabulary) is the tensor's shape, with fewer rows than \p
/// Global: the rows past it are zero. A non-empty \p HfWhole is the
/// extent of the tensor that all the plan's parameters sliced out of it
/// take (q, k and v of a fused c_attn): a larger tensor is another model's,
/// laid out otherwise. Throws RunError "<file>: <what>", also where a
/// loaded value is a NaN or an infinity.
void loadParamSlice(const WeightFiles &Files, const std::string &Name,
                    const std::string &HfName, const ShapeVec &HfOffset,
                    const ShapeVec &Global, const ShapeVec &Offset,
                    const ShapeVec &Local, float *Out,
                    const ShapeVec &HfShape = {}, const ShapeVec &HfWhole = {});

/// The index of the first NaN or infinity among \p N values, or -1.
int64_t firstNonFinite(const float *Values, size_t N);

/// "nan", "inf" or "-inf".
const char *nonFiniteName(float Value);

/// Where element \p At of a \p Local-shaped block placed at \p Start
/// lies in the whole tensor: "[3,130]".
std::string elementPlace(int64_t At, const ShapeVec &Local,
                         const ShapeVec &Start);

/// Where \p Files is a merged checkpoint (utils/merge_checkpoint.py: each
/// parameter whole as "param/<Name>", in the plan's own layout), copies
/// the slice (\p Local at \p Offset of \p Global) of parameter \p Name out
/// of it and returns true; false where it holds no such tensor. Throws
/// RunError where the tensor's shape is not \p Global.
bool loadMergedCheckpointParam(const WeightFiles &Files,
                               const std::string &Name, const ShapeVec &Global,
                               const ShapeVec &Offset, const ShapeVec &Local,
                               float *Out);

/// t[i] = splitmix64(splitmix64(Seed) + i) % Vocab for i < Count.
std::vector<int32_t> defaultTokenStream(uint64_t Seed, size_t Count,
                                        int64_t Vocab);

class TokenFile; // a token file, open (init.cpp)

/// A token stream the "tokens"/"labels" inputs are cut from: the seeded
/// default stream (unbounded: element i is defaultTokenStream's t[i]),
/// tokens held in memory, or a token file read where a step reads it.
class TokenSource {
public:
  static TokenSource seeded(uint64_t Seed, int64_t Vocab);
  static TokenSource fromTokens(std::vector<int32_t> Tokens);
  /// Every token of a token file (the formats and checks of
  /// readTokenFile), checked in one pass, then read from the file where a
  /// step reads it: no rank holds a copy,
  /// and the ranks of a node share its pages. Throws RunError where it
  /// holds fewer than \p MinCount tokens or one outside [0, \p Vocab),
  /// and read() where the file changed since.
  static TokenSource fromFile(const std::string &Path, size_t MinCount,
                              int64_t Vocab);
  /// Number of tokens; the seeded stream reports 2^62.
  uint64_t length() const;
  /// Tokens [\p From, \p From + \p N) into \p Out (a window: one read of
  /// a file).
  void read(uint64_t From, size_t N, int32_t *Out) const;
  bool isSeeded() const { return Seeded; }
  /// CRC-32 of the tokens as little-endian int32s (0 for the seeded
  /// stream): tells two data files of one length apart. Computed at the
  /// first call (a pass over a whole file), then kept: every checkpoint
  /// records it. Throws RunError where the file changed during the run.
  uint32_t fingerprint() const;

private:
  mutable std::optional<uint32_t> Fingerprint;
  bool Seeded = false;
  uint64_t Base = 0;
  int64_t Vocab = 1;
  std::vector<int32_t> T;
  std::shared_ptr<const TokenFile> File; // fromFile's
};

/// Position of the next global batch in a stream of \p Length tokens, given
/// this one's \p Pos and \p Stride = global_batch * seq tokens per batch:
/// p_{k+1} = (p_k + Stride) mod (Length - Stride - 1), i.e. p_k = (k * Stride)
/// mod (Length - Stride - 1), so that p_k + Stride + 1 <= Length (labels
/// read one token past the batch). A stream of exactly Stride + 1 tokens
/// gives position 0 for every step. Requires Length >= Stride + 1.
uint64_t nextDataPosition(uint64_t Pos, uint64_t Stride, uint64_t Length);

/// The files a token file \p Path (--data/--tokens) reads: itself, or a
/// Megatron dataset's PREFIX.bin and PREFIX.idx where it names one. For
/// the check that no output of the run overwrites one.
std::vector<std::string> tokenInputFiles(const std::string &Path);

/// Reads the first \p Count tokens of a nanoGPT-style raw uint16 file, or of
/// an llm.c .bin file (1024-byte header, magic 20240520; version 1 holds
/// uint16 tokens, version 2 uint32). Throws RunError "<path>: <what>" for
/// short files and out-of-vocabulary tokens.
std::vector<int32_t> readTokenFile(const std::string &Path, size_t Count,
                                   int64_t Vocab);

/// Calls Fn(LocalFlat, BigFlat, Len) for each contiguous innermost run of a
/// \p Local-shaped block placed at \p Start inside a \p Big-shaped tensor.
template <typename FnT>
void forEachRun(const ShapeVec &Local, const ShapeVec &Start,
                const ShapeVec &Big, FnT Fn) {
  const size_t R = Local.size();
  int64_t N = 1;
  for (int64_t D : Local)
    N *= D;
  if (N == 0)
    return;
  if (R == 0) {
    Fn(int64_t(0), int64_t(0), int64_t(1));
    return;
  }
  std::vector<int64_t> Stride(R, 1), Idx(R, 0);
  for (size_t I = R; I-- > 1;)
    Stride[I - 1] = Stride[I] * Big[I];
  const int64_t Len = Local[R - 1];
  for (int64_t L = 0; L < N; L += Len) {
    int64_t B = 0;
    for (size_t D = 0; D < R; ++D)
      B += (Start[D] + Idx[D]) * Stride[D];
    Fn(L, B, Len);
    for (size_t D = R - 1; D-- > 0;) {
      if (++Idx[D] < Local[D])
        break;
      Idx[D] = 0;
    }
  }
}

} // namespace megac_rt

#endif // MEGAC_RT_INIT_H
