//===- init.cpp - Parameter initialization and input tokens ---------------===//
//
// See init.h. Token files and checkpoints are external input, so sizes,
// dtypes and token ranges are all checked with messages that say which
// file, tensor or position is at fault.
//
//===----------------------------------------------------------------------===//

#include "init.h"
#include "error.h"
#include "file_io.h"
#include "megac_rt/plan_file.h"
#include "rng.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sys/stat.h>

namespace megac_rt {

namespace {
std::string listStr(const ShapeVec &S) {
  std::string R = "[";
  for (size_t I = 0; I < S.size(); ++I)
    R += (I ? "," : "") + std::to_string(S[I]);
  return R + "]";
}
} // namespace

void initParamSlice(const std::string &Name, InitMode Mode, double Std,
                    const ShapeVec &Global, const ShapeVec &Offset,
                    const ShapeVec &Local, uint64_t Seed, float *Out) {
  if (Mode != InitMode::Normal) {
    float V = Mode == InitMode::Ones ? 1.0f : 0.0f;
    forEachRun(Local, Offset, Global, [&](int64_t L, int64_t, int64_t Len) {
      std::fill(Out + L, Out + L + Len, V);
    });
    return;
  }
  const uint64_t Key = paramKey(Name, Seed);
  forEachRun(Local, Offset, Global, [&](int64_t L, int64_t G, int64_t Len) {
    for (int64_t J = 0; J < Len; ++J)
      Out[L + J] = float(Std * normalAt(Key, uint64_t(G + J)));
  });
}

void loadParamSlice(const WeightFiles &Files, const std::string &Name,
                    const std::string &HfName, const ShapeVec &HfOffset,
                    const ShapeVec &Global, const ShapeVec &Offset,
                    const ShapeVec &Local, float *Out,
                    const ShapeVec &HfShape) {
  WeightFiles::Found F = Files.find(HfName);
  std::string Alt;
  if (!F.tensor) {
    const std::string Pfx = "transformer.";
    Alt = HfName.compare(0, Pfx.size(), Pfx) == 0 ? HfName.substr(Pfx.size())
                                                  : Pfx + HfName;
    F = Files.find(Alt);
  }
  if (!F.tensor)
    throw RunError(Files.path() + ": tensor \"" + HfName +
                   "\" (for parameter " + Name + ") not found (also tried \"" +
                   Alt + "\")");
  // Messages name the file that holds the tensor (a shard's, under an
  // index).
  const std::string &Path = F.file->path();
  const TensorInfo *T = F.tensor;
  const SafetensorsFile &File = *F.file;
  // A parameter that is the file's tensor itself must have its shape:
  // taking a corner of a larger tensor would load another model's weights
  // without a word. Only a parameter declared as a slice of a tensor of
  // another name (GPT-2's fused c_attn split into q, k and v) reads part
  // of it.
  // (A checkpoint saved with the padding rows, as nanoGPT's 50304-row
  // ones, holds the whole parameter.)
  const ShapeVec &Whole =
      HfShape.empty() || T->shape == Global ? Global : HfShape;
  if (HfName == Name && T->shape != Whole)
    throw RunError(Path + ": tensor \"" + T->name + "\" has shape " +
                   listStr(T->shape) + " but parameter " + Name + " is " +
                   listStr(Whole) +
                   ": the weights are another model's (compare the "
                   "config's layers, hidden size, vocabulary and positions)");
  if (!HfShape.empty() && Whole == HfShape && HfShape[0] < Global[0]) {
    // A padded vocabulary: this rank's rows from HfShape[0] on are
    // padding, zero; the rows before it come from the file.
    const int64_t Rows = std::clamp<int64_t>(HfShape[0] - Offset[0], 0,
                                             Local[0]);
    int64_t RowElems = 1;
    for (size_t D = 1; D < Local.size(); ++D)
      RowElems *= Local[D];
    std::fill(Out + Rows * RowElems, Out + Local[0] * RowElems, 0.0f);
    if (Rows == 0)
      return;
    ShapeVec Kept = Local;
    Kept[0] = Rows;
    loadParamSlice(Files, Name, HfName, HfOffset, HfShape, Offset, Kept, Out,
                   {});
    return;
  }
  bool ShapeOk = T->shape.size() == Global.size();
  for (size_t D = 0; ShapeOk && D < Global.size(); ++D)
    ShapeOk = HfOffset[D] + Global[D] <= T->shape[D];
  if (!ShapeOk) {
    std::string Need = listStr(Global);
    if (std::any_of(HfOffset.begin(), HfOffset.end(),
                    [](int64_t O) { return O != 0; }))
      Need += " at offset " + listStr(HfOffset);
    throw RunError(Path + ": tensor \"" + T->name + "\" has shape " +
                   listStr(T->shape) + " but parameter " + Name +
                   " expects " + Need + " within it");
  }
  ShapeVec Start(Global.size());
  for (size_t D = 0; D < Global.size(); ++D)
    Start[D] = HfOffset[D] + Offset[D];
  const uint8_t *Src = File.data(*T);
  const std::string &DT = T->dtype;
  if (DT != "F32" && DT != "F16" && DT != "BF16")
    throw RunError(Path + ": tensor \"" + T->name + "\" has dtype " + DT +
                   " (expected F32, F16 or BF16)");
  forEachRun(Local, Start, T->shape, [&](int64_t L, int64_t B, int64_t Len) {
    if (DT == "F32") {
      std::memcpy(Out + L, Src + B * 4, size_t(Len) * 4);
      return;
    }
    for (int64_t J = 0; J < Len; ++J) {
      uint16_t H;
      std::memcpy(&H, Src + (B + J) * 2, 2);
      Out[L + J] = DT == "F16" ? halfToFloat(H) : bf16ToFloat(H);
    }
  });
}

std::vector<int32_t> defaultTokenStream(uint64_t Seed, size_t Count,
                                        int64_t Vocab) {
  std::vector<int32_t> T(Count);
  const uint64_t Base = splitmix64(Seed);
  for (size_t I = 0; I < Count; ++I)
    T[I] = int32_t(splitmix64(Base + I) % uint64_t(Vocab));
  return T;
}

TokenSource TokenSource::seeded(uint64_t Seed, int64_t Vocab) {
  TokenSource S;
  S.Seeded = true;
  S.Base = splitmix64(Seed);
  S.Vocab = Vocab > 0 ? Vocab : 1;
  return S;
}

TokenSource TokenSource::fromTokens(std::vector<int32_t> Tokens) {
  TokenSource S;
  S.T = std::move(Tokens);
  return S;
}

uint32_t TokenSource::fingerprint() const {
  if (Seeded)
    return 0;
  if (!Fingerprint)
    Fingerprint = crc32(reinterpret_cast<const uint8_t *>(T.data()),
                        T.size() * sizeof(int32_t));
  return *Fingerprint;
}

int32_t TokenSource::at(uint64_t I) const {
  if (Seeded)
    return int32_t(splitmix64(Base + I) % uint64_t(Vocab));
  return T[size_t(I)];
}

uint64_t nextDataPosition(uint64_t Pos, uint64_t Stride, uint64_t Length) {
  if (Length < Stride + 1)
    return 0;
  uint64_t M = Length - Stride - 1;
  if (M == 0)
    return 0;
  return (Pos % M + Stride % M) % M;
}

namespace {
/// The \p Width-byte little-endian unsigned value at \p P (token files).
uint64_t loadLittleEndian(const uint8_t *P, size_t Width) {
  uint64_t V = 0;
  for (size_t B = 0; B < Width; ++B)
    V |= uint64_t(P[B]) << (8 * B);
  return V;
}

bool isRegularFile(const std::string &Path) {
  struct stat St;
  return ::stat(Path.c_str(), &St) == 0 && S_ISREG(St.st_mode);
}

const char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

/// The prefix of a Megatron-LM indexed dataset (PREFIX.idx and
/// PREFIX.bin, as its preprocess_data.py writes them) that \p Path names:
/// PREFIX.bin with a Megatron index beside it, or PREFIX itself (Megatron's
/// --data-path form) when no file of that name exists. "" otherwise.
std::string megatronPrefix(const std::string &Path) {
  auto HasMagic = [](const std::string &Idx) {
    char Head[sizeof(kMegatronMagic)] = {};
    std::ifstream F(Idx, std::ios::binary);
    return F.read(Head, sizeof(Head)) &&
           std::memcmp(Head, kMegatronMagic, sizeof(Head)) == 0;
  };
  if (Path.size() > 4 && endsWith(Path, ".bin")) {
    std::string Prefix = Path.substr(0, Path.size() - 4);
    return isRegularFile(Prefix + ".idx") && HasMagic(Prefix + ".idx") ? Prefix
                                                                       : "";
  }
  struct stat St;
  if (::stat(Path.c_str(), &St) != 0 && isRegularFile(Path + ".idx"))
    return Path;
  return "";
}

/// Reads \p Count tokens (all when \p All, then at least Count) of the
/// Megatron indexed dataset \p Prefix: its sequences in index order, one
/// stream, as the GPT dataset concatenates documents. The index is
/// "MMIDIDX\0\0", version 1 (u64), the dtype code (u8), the sequence and
/// document counts (u64), then per sequence its token count (i32) and byte
/// offset in the .bin (i64), then the document index (i64). Every field is
/// checked against the two files' sizes.
std::vector<int32_t> readMegatronTokens(const std::string &Prefix, size_t Count,
                                        int64_t Vocab, bool All) {
  const std::string Idx = Prefix + ".idx", Bin = Prefix + ".bin";
  std::ifstream I(Idx, std::ios::binary | std::ios::ate);
  if (!I)
    throw RunError(Idx +
                   ": cannot open the Megatron index: " + std::strerror(errno));
  const uint64_t IdxSize = uint64_t(I.tellg());
  I.seekg(0);
  char Magic[sizeof(kMegatronMagic)];
  uint64_t Version = 0, NSeq = 0, NDoc = 0;
  uint8_t Code = 0;
  const uint64_t HeaderBytes = sizeof(Magic) + 8 + 1 + 8 + 8;
  if (IdxSize < HeaderBytes || !I.read(Magic, sizeof(Magic)) ||
      !I.read(reinterpret_cast<char *>(&Version), 8) ||
      !I.read(reinterpret_cast<char *>(&Code), 1) ||
      !I.read(reinterpret_cast<char *>(&NSeq), 8) ||
      !I.read(reinterpret_cast<char *>(&NDoc), 8))
    throw RunError(Idx + ": " + std::to_string(IdxSize) +
                   " bytes, too short for a Megatron index header");
  if (std::memcmp(Magic, kMegatronMagic, sizeof(Magic)) != 0)
    throw RunError(Idx + ": not a Megatron index (it does not start with "
                         "MMIDIDX)");
  if (Version != 1)
    throw RunError(Idx + ": Megatron index version " + std::to_string(Version) +
                   " is not supported (expected 1)");
  // Megatron's DType codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
  // 6 float64, 7 float32, 8 uint16.
  static const int Widths[9] = {0, 1, 1, 2, 4, 8, 0, 0, 2};
  const bool Signed = Code >= 2 && Code <= 5;
  if (Code < 1 || Code > 8 || Widths[Code] == 0)
    throw RunError(Idx + ": dtype code " + std::to_string(int(Code)) +
                   (Code == 6 || Code == 7
                        ? " holds floating-point values, not token ids"
                        : " is not one of Megatron's (1 to 8)"));
  const uint64_t Width = uint64_t(Widths[Code]);
  if (NSeq > IdxSize || NDoc > IdxSize ||
      HeaderBytes + NSeq * 12 + NDoc * 8 != IdxSize)
    throw RunError(Idx + ": announces " + std::to_string(NSeq) +
                   " sequences and " + std::to_string(NDoc) +
                   " documents, which need " +
                   (NSeq > IdxSize || NDoc > IdxSize
                        ? std::string("more bytes than it has")
                        : std::to_string(HeaderBytes + NSeq * 12 + NDoc * 8) +
                              " bytes, not " + std::to_string(IdxSize)) +
                   ": a damaged index");
  std::vector<int32_t> Sizes(NSeq);
  std::vector<int64_t> Pointers(NSeq);
  if (NSeq && (!I.read(reinterpret_cast<char *>(Sizes.data()),
                       std::streamsize(NSeq * 4)) ||
               !I.read(reinterpret_cast<char *>(Pointers.data()),
                       std::streamsize(NSeq * 8))))
    throw RunError(Idx + ": error reading the Megatron index");
  std::ifstream B(Bin, std::ios::binary | std::ios::ate);
  if (!B)
    throw RunError(
        Bin + ": cannot open the Megatron data file: " + std::strerror(errno));
  const uint64_t BinSize = uint64_t(B.tellg());
  uint64_t Total = 0;
  for (uint64_t K = 0; K < NSeq; ++K) {
    const int64_t At = Pointers[K], N = Sizes[K];
    if (N < 0 || At < 0 || uint64_t(At) % Width != 0 ||
        uint64_t(At) > BinSize ||
        uint64_t(N) > (BinSize - uint64_t(At)) / Width)
      throw RunError(Idx + ": sequence " + std::to_string(K) + " (" +
                     std::to_string(N) + " tokens at byte " +
                     std::to_string(At) + ") does not lie within " + Bin +
                     " (" + std::to_string(BinSize) +
                     " bytes): the index does not describe this data file");
    Total += uint64_t(N);
  }
  if (Total < Count)
    throw RunError(Prefix + ": holds " + std::to_string(Total) +
                   " tokens (Megatron indexed dataset, " +
                   std::to_string(NSeq) + " sequences) but the plan needs " +
                   std::to_string(Count));
  if (All) {
    if (Total > uint64_t(SIZE_MAX / 8))
      throw RunError(Prefix + ": token file is too large");
    Count = size_t(Total);
  }
  std::vector<int32_t> T;
  T.reserve(Count);
  std::vector<uint8_t> Raw;
  for (uint64_t K = 0; K < NSeq && T.size() < Count; ++K) {
    const uint64_t N = std::min<uint64_t>(uint64_t(Sizes[K]), Count - T.size());
    Raw.resize(size_t(N * Width));
    B.clear();
    B.seekg(std::streamoff(Pointers[K]));
    if (N && !B.read(reinterpret_cast<char *>(Raw.data()),
                     std::streamsize(Raw.size())))
      throw RunError(Bin + ": error reading the Megatron data file");
    for (uint64_t J = 0; J < N; ++J) {
      const uint64_t U = loadLittleEndian(&Raw[size_t(J * Width)], Width);
      int64_t V = int64_t(U);
      if (Signed && Width < 8 && (U >> (8 * Width - 1)) & 1)
        V = int64_t(U) - (int64_t(1) << (8 * Width)); // sign-extend
      if (V < 0 || V >= Vocab)
        throw RunError(
            Bin + ": token " + std::to_string(V) + " at position " +
            std::to_string(T.size()) + " (sequence " + std::to_string(K) +
            ") is outside the vocabulary (size " + std::to_string(Vocab) + ")");
      T.push_back(int32_t(V));
    }
  }
  return T;
}

/// Reads \p Count tokens, or all of them when \p All (then at least Count).
std::vector<int32_t> readTokens(const std::string &Path, size_t Count,
                                int64_t Vocab, bool All) {
  if (std::string Prefix = megatronPrefix(Path); !Prefix.empty())
    return readMegatronTokens(Prefix, Count, Vocab, All);
  struct stat St;
  if (::stat(Path.c_str(), &St) == 0 && S_ISDIR(St.st_mode))
    throw RunError(Path + ": is a directory, not a token file");
  std::ifstream F(Path, std::ios::binary | std::ios::ate);
  if (!F)
    throw RunError(Path + ": cannot open token file: " + std::strerror(errno));
  const uint64_t Size = uint64_t(F.tellg());
  F.seekg(0);
  uint64_t Start = 0, Available = Size / 2;
  size_t Width = 2;
  std::string Format = "raw uint16";
  if (Size >= 1024) {
    int32_t Hdr[256];
    if (!F.read(reinterpret_cast<char *>(Hdr), sizeof(Hdr)))
      throw RunError(Path + ": error reading token file");
    if (Hdr[0] == 20240520) {
      if (Hdr[1] != 1 && Hdr[1] != 2)
        throw RunError(Path + ": llm.c token file version " +
                       std::to_string(Hdr[1]) +
                       " is not supported (expected 1 or 2)");
      Width = Hdr[1] == 1 ? 2 : 4;
      Start = 1024;
      Format = "llm.c token file";
      const uint64_t Body = Size - 1024;
      if (Hdr[2] < 0)
        throw RunError(Path +
                       ": llm.c header announces a negative number "
                       "of tokens (" +
                       std::to_string(Hdr[2]) + "): a damaged header");
      // As llm.c's own loader: the header's count is the file's.
      if (uint64_t(Hdr[2]) * Width != Body)
        throw RunError(Path + ": llm.c header announces " +
                       std::to_string(Hdr[2]) + " tokens but the file holds " +
                       std::to_string(Body / Width) +
                       (Body % Width ? " and a part of one" : "") +
                       (uint64_t(Hdr[2]) * Width > Body ? " (truncated?)"
                                                        : " (appended to?)"));
      Available = uint64_t(Hdr[2]);
    }
  }
  if (Start == 0 && Size % 2 != 0)
    throw RunError(Path + ": " + std::to_string(Size) +
                   " bytes, an odd number: not raw uint16 tokens (nor an "
                   "llm.c token file)");
  if (Available < Count)
    throw RunError(Path + ": holds " + std::to_string(Available) + " tokens (" +
                   Format + ") but the plan needs " + std::to_string(Count));
  if (All) {
    if (Available > uint64_t(SIZE_MAX / 8))
      throw RunError(Path + ": token file is too large");
    Count = size_t(Available);
  }
  std::vector<uint8_t> Raw(Count * Width);
  F.clear();
  F.seekg(std::streamoff(Start));
  if (Count && !F.read(reinterpret_cast<char *>(Raw.data()),
                       std::streamsize(Raw.size())))
    throw RunError(Path + ": error reading token file");
  std::vector<int32_t> T(Count);
  for (size_t I = 0; I < Count; ++I) {
    const uint64_t V = loadLittleEndian(&Raw[I * Width], Width);
    if (int64_t(V) >= Vocab)
      throw RunError(Path + ": token " + std::to_string(V) + " at position " +
                     std::to_string(I) + " is outside the vocabulary (size " +
                     std::to_string(Vocab) + ")");
    T[I] = int32_t(V);
  }
  return T;
}
} // namespace

std::vector<int32_t> readTokenFile(const std::string &Path, size_t Count,
                                   int64_t Vocab) {
  return readTokens(Path, Count, Vocab, false);
}

std::vector<int32_t> readAllTokens(const std::string &Path, size_t MinCount,
                                   int64_t Vocab) {
  return readTokens(Path, MinCount, Vocab, true);
}

} // namespace megac_rt
