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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <memory>
#include <numeric>
#include <sys/stat.h>
#include <unistd.h>

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
                    const ShapeVec &Local, float *Out, const ShapeVec &HfShape,
                    const ShapeVec &HfWhole) {
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
  // Every slice fits, but the tensor is larger than the slices together:
  // its rows are laid out otherwise, and each slice would read the wrong
  // values.
  if (!HfWhole.empty() && T->shape != HfWhole)
    throw RunError(Path + ": tensor \"" + T->name + "\" has shape " +
                   listStr(T->shape) + " but the plan's parameters take " +
                   listStr(HfWhole) +
                   " of it: the weights are another model's (compare the "
                   "config's layers, hidden size, vocabulary and positions)");
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
  // Training from a NaN or an infinity gives a loss of nan at the first
  // step, and no step after it recovers: refused where it is found, named
  // by its place in the file's tensor.
  const size_t N = size_t(std::accumulate(Local.begin(), Local.end(),
                                          int64_t(1), std::multiplies<>()));
  if (const int64_t At = firstNonFinite(Out, N); At >= 0)
    throw RunError(Path + ": tensor \"" + T->name + "\" holds " +
                   nonFiniteName(Out[At]) + " at " +
                   elementPlace(At, Local, Start) + " (in parameter " + Name +
                   "): the weights are corrupt, or were saved by a run "
                   "that diverged");
}

int64_t firstNonFinite(const float *Values, size_t N) {
  // Blocks tested without a branch per value (the loop vectorizes), the
  // one that holds a NaN or infinity searched again: a 1.3B-parameter
  // model's state is scanned at memory speed.
  constexpr size_t Block = 4096;
  for (size_t B = 0; B < N; B += Block) {
    const size_t End = std::min(N, B + Block);
    uint32_t Any = 0;
    for (size_t I = B; I < End; ++I) {
      uint32_t Bits;
      std::memcpy(&Bits, Values + I, 4);
      Any |= uint32_t((Bits & 0x7F800000u) == 0x7F800000u);
    }
    if (Any)
      for (size_t I = B; I < End; ++I)
        if (!std::isfinite(Values[I]))
          return int64_t(I);
  }
  return -1;
}

const char *nonFiniteName(float Value) {
  return std::isnan(Value) ? "nan" : Value > 0 ? "inf" : "-inf";
}

std::string elementPlace(int64_t At, const ShapeVec &Local,
                         const ShapeVec &Start) {
  ShapeVec Index(Local.size());
  for (size_t D = Local.size(); D-- > 0;) {
    Index[D] = (D < Start.size() ? Start[D] : 0) + At % Local[D];
    At /= Local[D];
  }
  return listStr(Index);
}

bool loadMergedCheckpointParam(const WeightFiles &Files,
                               const std::string &Name, const ShapeVec &Global,
                               const ShapeVec &Offset, const ShapeVec &Local,
                               float *Out) {
  const std::string Merged = "param/" + Name;
  const WeightFiles::Found F = Files.find(Merged);
  if (!F.tensor)
    return false;
  if (F.tensor->shape != Global)
    throw RunError(F.file->path() + ": tensor \"" + Merged + "\" has shape " +
                   listStr(F.tensor->shape) + " but parameter " + Name +
                   " is " + listStr(Global) +
                   ": the checkpoint is another model's");
  loadParamSlice(Files, Name, Merged, ShapeVec(Global.size(), 0), Global,
                 Offset, Local, Out);
  return true;
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
  // The index alone is no token file: what the user means is its dataset.
  // (Opening a FIFO would wait for a writer: regular files only.)
  if (Path.size() > 4 && endsWith(Path, ".idx") && isRegularFile(Path) &&
      HasMagic(Path)) {
    const std::string Prefix = Path.substr(0, Path.size() - 4);
    throw RunError(Path +
                   ": the index of a Megatron dataset; name the "
                   "dataset by its prefix, " +
                   Prefix + " (or its " + Prefix + ".bin)");
  }
  return "";
}

/// Where a token file's tokens lie: runs of Width-byte little-endian
/// integers in DataPath, in stream order.
struct TokenLayout {
  std::string Name;     // what "holds N tokens" names: the file, or a prefix
  std::string DataPath; // the file holding the tokens
  std::string Format;   // "raw uint16", "llm.c token file", ...
  size_t Width = 2;
  bool Signed = false;
  bool Megatron = false;
  struct Run {
    uint64_t Start, Byte, Count; // stream position, byte offset, tokens
  };
  std::vector<Run> Runs;
  std::vector<int32_t> SequenceSizes; // Megatron's, to name a sequence
  uint64_t Total = 0;

  /// Appends \p Count tokens at byte \p Byte, into the last run where
  /// they follow it in the file (a dataset written in order is one run).
  void append(uint64_t Byte, uint64_t Count) {
    if (!Count)
      return;
    if (!Runs.empty() && Runs.back().Byte + Runs.back().Count * Width == Byte)
      Runs.back().Count += Count;
    else
      Runs.push_back({Total, Byte, Count});
    Total += Count;
  }
};

/// The layout of the Megatron indexed dataset \p Prefix: its sequences in
/// index order, one stream, as the GPT dataset concatenates documents.
/// The index is "MMIDIDX\0\0", version 1 (u64), the dtype code (u8), the
/// sequence and document counts (u64), then per sequence its token count
/// (i32) and byte offset in the .bin (i64), then the document index
/// (i64). Every field is checked against the two files' sizes.
TokenLayout megatronLayout(const std::string &Prefix) {
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
  if (Code < 1 || Code > 8 || Widths[Code] == 0)
    throw RunError(Idx + ": dtype code " + std::to_string(int(Code)) +
                   (Code == 6 || Code == 7
                        ? " holds floating-point values, not token ids"
                        : " is not one of Megatron's (1 to 8)"));
  TokenLayout L;
  L.Name = Prefix;
  L.DataPath = Bin;
  L.Megatron = true;
  L.Signed = Code >= 2 && Code <= 5;
  L.Width = size_t(Widths[Code]);
  const uint64_t Width = L.Width;
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
  L.SequenceSizes.resize(NSeq);
  std::vector<int64_t> Pointers(NSeq);
  if (NSeq && (!I.read(reinterpret_cast<char *>(L.SequenceSizes.data()),
                       std::streamsize(NSeq * 4)) ||
               !I.read(reinterpret_cast<char *>(Pointers.data()),
                       std::streamsize(NSeq * 8))))
    throw RunError(Idx + ": error reading the Megatron index");
  const int64_t BinBytes = regularFileSize(Bin);
  if (BinBytes < 0)
    throw RunError(
        Bin + ": cannot open the Megatron data file: " + std::strerror(errno));
  const uint64_t BinSize = uint64_t(BinBytes);
  // Sequences are stored one after another: together they fit the data
  // file (overlapping ones would make the file read many times over: 64
  // sequences of 2^31 tokens at byte 0 once hung the vocabulary check).
  uint64_t Stored = 0;
  for (uint64_t K = 0; K < NSeq; ++K) {
    const int64_t At = Pointers[K], N = L.SequenceSizes[K];
    if (N < 0 || At < 0 || uint64_t(At) % Width != 0 ||
        uint64_t(At) > BinSize ||
        uint64_t(N) > (BinSize - uint64_t(At)) / Width)
      throw RunError(Idx + ": sequence " + std::to_string(K) + " (" +
                     std::to_string(N) + " tokens at byte " +
                     std::to_string(At) + ") does not lie within " + Bin +
                     " (" + std::to_string(BinSize) +
                     " bytes): the index does not describe this data file");
    Stored += uint64_t(N) * Width;
    if (Stored > BinSize)
      throw RunError(Idx + ": sequences 0 to " + std::to_string(K) + " hold " +
                     std::to_string(Stored) + " bytes, more than " + Bin +
                     " has (" + std::to_string(BinSize) +
                     "): sequences overlap, and the index does not describe "
                     "this data file");
    L.append(uint64_t(At), uint64_t(N));
  }
  // The document index: where each document's sequences begin, from 0
  // and rising, within the sequence count (Megatron's builder starts it
  // at 0 and appends the count at each document's end; an index whose
  // builder never ended a document holds [0] alone). The stream does not
  // read it, but a damaged one says the index is.
  std::vector<int64_t> Documents(NDoc);
  if (NDoc && !I.read(reinterpret_cast<char *>(Documents.data()),
                      std::streamsize(NDoc * 8)))
    throw RunError(Idx + ": error reading the Megatron index");
  for (uint64_t K = 0; K < NDoc; ++K)
    if ((K == 0 && Documents[0] != 0) ||
        (K > 0 && Documents[K] < Documents[K - 1]) ||
        uint64_t(Documents[K]) > NSeq)
      throw RunError(Idx + ": document index entry " + std::to_string(K) +
                     " is " + std::to_string(Documents[K]) +
                     " (its entries start at 0 and rise to at most the "
                     "sequence count, " +
                     std::to_string(NSeq) + "): a damaged index");
  L.Format = "Megatron indexed dataset, " + std::to_string(NSeq) + " sequences";
  return L;
}

/// The layout of a raw uint16 file or an llm.c token file \p Path.
TokenLayout plainLayout(const std::string &Path) {
  struct stat St;
  // Every rank reads the file, from where it likes: a pipe would give each
  // a part, and a second read nothing.
  if (::stat(Path.c_str(), &St) == 0 && !S_ISREG(St.st_mode))
    throw RunError(Path + (S_ISDIR(St.st_mode)
                               ? ": is a directory, not a token file"
                               : ": not a regular file (a pipe or a device?): "
                                 "the token file is read by every rank, so it "
                                 "must be a file"));
  std::ifstream F(Path, std::ios::binary | std::ios::ate);
  if (!F)
    throw RunError(Path + ": cannot open token file: " + std::strerror(errno));
  const uint64_t Size = uint64_t(F.tellg());
  F.seekg(0);
  TokenLayout L;
  L.Name = L.DataPath = Path;
  L.Format = "raw uint16";
  uint64_t Start = 0, Available = Size / 2;
  if (Size >= 1024) {
    int32_t Hdr[256];
    if (!F.read(reinterpret_cast<char *>(Hdr), sizeof(Hdr)))
      throw RunError(Path + ": error reading token file");
    if (Hdr[0] == 20240520) {
      if (Hdr[1] != 1 && Hdr[1] != 2)
        throw RunError(Path + ": llm.c token file version " +
                       std::to_string(Hdr[1]) +
                       " is not supported (expected 1 or 2)");
      L.Width = Hdr[1] == 1 ? 2 : 4;
      Start = 1024;
      L.Format = "llm.c token file";
      const uint64_t Body = Size - 1024;
      if (Hdr[2] < 0)
        throw RunError(Path +
                       ": llm.c header announces a negative number "
                       "of tokens (" +
                       std::to_string(Hdr[2]) + "): a damaged header");
      // As llm.c's own loader: the header's count is the file's.
      if (uint64_t(Hdr[2]) * L.Width != Body)
        throw RunError(Path + ": llm.c header announces " +
                       std::to_string(Hdr[2]) + " tokens but the file holds " +
                       std::to_string(Body / L.Width) +
                       (Body % L.Width ? " and a part of one" : "") +
                       (uint64_t(Hdr[2]) * L.Width > Body ? " (truncated?)"
                                                          : " (appended to?)"));
      Available = uint64_t(Hdr[2]);
    }
  }
  if (Start == 0 && Size % 2 != 0)
    throw RunError(Path + ": " + std::to_string(Size) +
                   " bytes, an odd number: not raw uint16 tokens (nor an "
                   "llm.c token file)");
  L.append(Start, Available);
  return L;
}

TokenLayout tokenLayout(const std::string &Path) {
  if (std::string Prefix = megatronPrefix(Path); !Prefix.empty())
    return megatronLayout(Prefix);
  return plainLayout(Path);
}

/// Refuses a file of fewer than \p Count tokens.
void requireTokens(const TokenLayout &L, uint64_t Count) {
  if (L.Total < Count)
    throw RunError(L.Name + ": holds " + std::to_string(L.Total) + " tokens (" +
                   L.Format + ") but the plan needs " + std::to_string(Count));
}
} // namespace

std::vector<std::string> tokenInputFiles(const std::string &Path) {
  if (const std::string Prefix = megatronPrefix(Path); !Prefix.empty())
    return {Prefix + ".bin", Prefix + ".idx"};
  return {Path};
}

/// A token file, open: the tokens are read from it (pread) where a step
/// reads them, so that no rank holds a decoded copy of the whole file and
/// the ranks of a node share its pages in the page cache. A file changed
/// under a run (truncated, rewritten in place) is an error where it is
/// next read, not a crash or other tokens; one replaced by a rename is
/// read as it was, through the descriptor.
class TokenFile {
public:
  explicit TokenFile(TokenLayout Layout) : L(std::move(Layout)) {
    Fd = ::open(L.DataPath.c_str(), O_RDONLY | O_CLOEXEC);
    if (Fd < 0)
      throw RunError(L.DataPath +
                     ": cannot open token file: " + std::strerror(errno));
    if (::fstat(Fd, &Opened) != 0 || !S_ISREG(Opened.st_mode)) {
      ::close(Fd);
      throw RunError(L.DataPath + ": not a regular file");
    }
    // (The layout was read before the file was opened: one cut since.)
    for (const TokenLayout::Run &R : L.Runs)
      if (R.Byte + R.Count * L.Width > uint64_t(Opened.st_size)) {
        ::close(Fd);
        throw RunError(L.DataPath + ": changed while it was read");
      }
  }
  ~TokenFile() { ::close(Fd); }
  TokenFile(const TokenFile &) = delete;
  TokenFile &operator=(const TokenFile &) = delete;

  uint64_t length() const { return L.Total; }

  /// Calls \p Fn(Values, N, First) for the tokens [\p From, \p To) of the
  /// stream, a piece at a time (Values[k] is token First + k), as read
  /// from the file: unchecked against any vocabulary.
  template <typename FnT>
  void forEachPiece(uint64_t From, uint64_t To, FnT &&Fn) const {
    constexpr uint64_t kPiece = 1 << 16;
    std::vector<uint8_t> Bytes;
    std::vector<int64_t> Values;
    for (uint64_t At = From; At < To;) {
      const TokenLayout::Run &R = runOf(At);
      const uint64_t N = std::min({To - At, R.Start + R.Count - At, kPiece});
      readBytes(R.Byte + (At - R.Start) * L.Width, size_t(N * L.Width), Bytes);
      Values.resize(size_t(N));
      if (L.Width == 2 && !L.Signed) // (the common file, a tight loop)
        for (size_t K = 0; K < N; ++K)
          Values[K] = int64_t(Bytes[2 * K]) | int64_t(Bytes[2 * K + 1]) << 8;
      else
        for (size_t K = 0; K < N; ++K)
          Values[K] = decode(Bytes.data() + K * L.Width);
      Fn(Values.data(), size_t(N), At);
      At += N;
    }
  }

  /// Tokens [\p From, \p From + \p N) into \p Out, each checked against
  /// [0, \p Vocab) (a file rewritten since its check).
  void read(uint64_t From, size_t N, int64_t Vocab, int32_t *Out) const {
    forEachPiece(From, From + N,
                 [&](const int64_t *V, size_t K, uint64_t First) {
                   for (size_t J = 0; J < K; ++J) {
                     if (V[J] < 0 || V[J] >= Vocab)
                       throw outsideVocabulary(V[J], First + J, Vocab);
                     Out[First - From + J] = int32_t(V[J]);
                   }
                 });
  }

  /// Checks every token against [0, \p Vocab): one pass over the file.
  void checkVocabulary(int64_t Vocab) const {
    forEachPiece(0, L.Total, [&](const int64_t *V, size_t N, uint64_t First) {
      for (size_t J = 0; J < N; ++J)
        if (V[J] < 0 || V[J] >= Vocab)
          throw outsideVocabulary(V[J], First + J, Vocab);
    });
  }

  /// The CRC-32 of every token as a little-endian int32
  /// (TokenSource::fingerprint): another pass over the file, taken only
  /// when a checkpoint records it.
  uint32_t crc() const {
    uint32_t Crc = 0;
    std::vector<uint8_t> Bytes;
    forEachPiece(0, L.Total, [&](const int64_t *V, size_t N, uint64_t) {
      Bytes.resize(N * 4);
      for (size_t J = 0; J < N; ++J)
        for (size_t B = 0; B < 4; ++B)
          Bytes[J * 4 + B] = uint8_t(uint32_t(V[J]) >> (8 * B));
      Crc = crc32Update(Crc, Bytes.data(), Bytes.size());
    });
    return Crc;
  }

private:
  const TokenLayout::Run &runOf(uint64_t I) const {
    if (L.Runs.size() == 1)
      return L.Runs[0];
    auto It = std::upper_bound(
        L.Runs.begin(), L.Runs.end(), I,
        [](uint64_t P, const TokenLayout::Run &R) { return P < R.Start; });
    return *(It - 1);
  }

  /// \p Size bytes at \p Offset into \p Out, from the file as it was
  /// opened: a file changed since is refused.
  void readBytes(uint64_t Offset, size_t Size,
                 std::vector<uint8_t> &Out) const {
    struct stat Now;
    if (::fstat(Fd, &Now) != 0 || Now.st_size != Opened.st_size ||
        Now.st_mtim.tv_sec != Opened.st_mtim.tv_sec ||
        Now.st_mtim.tv_nsec != Opened.st_mtim.tv_nsec)
      throw RunError(L.DataPath + ": changed during the run (its size or "
                                  "modification time is not what it was "
                                  "when the run opened it)");
    Out.resize(Size);
    for (size_t Got = 0; Got < Size;) {
      const ssize_t R =
          ::pread(Fd, Out.data() + Got, Size - Got, off_t(Offset + Got));
      if (R < 0 && errno == EINTR)
        continue;
      if (R <= 0)
        throw RunError(L.DataPath + ": cannot read token file: " +
                       (R < 0 ? std::strerror(errno) : "it is shorter now"));
      Got += size_t(R);
    }
  }

  int64_t decode(const uint8_t *P) const {
    const uint64_t U = loadLittleEndian(P, L.Width);
    if (L.Signed && L.Width < 8 && (U >> (8 * L.Width - 1)) & 1)
      return int64_t(U) - (int64_t(1) << (8 * L.Width)); // sign-extend
    return int64_t(U);
  }

  RunError outsideVocabulary(int64_t V, uint64_t P, int64_t Vocab) const {
    return RunError(L.DataPath + ": token " + std::to_string(V) +
                    " at position " + std::to_string(P) + sequenceOf(P) +
                    " is outside the vocabulary (size " +
                    std::to_string(Vocab) + ")");
  }

  /// " (sequence K)" for a Megatron dataset's stream position \p P.
  std::string sequenceOf(uint64_t P) const {
    if (!L.Megatron)
      return "";
    uint64_t Seen = 0;
    for (size_t K = 0; K < L.SequenceSizes.size(); ++K) {
      Seen += uint64_t(L.SequenceSizes[K]);
      if (P < Seen)
        return " (sequence " + std::to_string(K) + ")";
    }
    return "";
  }

  TokenLayout L;
  int Fd = -1;
  struct stat Opened {};
};

TokenSource TokenSource::fromFile(const std::string &Path, size_t MinCount,
                                  int64_t Vocab) {
  TokenLayout L = tokenLayout(Path);
  requireTokens(L, MinCount);
  TokenSource S;
  auto File = std::make_shared<TokenFile>(std::move(L));
  File->checkVocabulary(Vocab);
  S.Vocab = Vocab;
  S.File = std::move(File);
  return S;
}

uint32_t TokenSource::fingerprint() const {
  if (Seeded)
    return 0;
  // (A file changed since the run opened it throws: the CRC is of the
  // tokens the run read.)
  if (!Fingerprint)
    Fingerprint = File ? File->crc()
                       : crc32(reinterpret_cast<const uint8_t *>(T.data()),
                               T.size() * sizeof(int32_t));
  return *Fingerprint;
}

void TokenSource::read(uint64_t From, size_t N, int32_t *Out) const {
  if (Seeded) {
    for (size_t I = 0; I < N; ++I)
      Out[I] = int32_t(splitmix64(Base + From + I) % uint64_t(Vocab));
  } else if (File) {
    File->read(From, N, Vocab, Out);
  } else {
    std::copy(T.begin() + long(From), T.begin() + long(From + N), Out);
  }
}

uint64_t TokenSource::length() const {
  return Seeded ? (uint64_t(1) << 62) : File ? File->length() : T.size();
}

std::vector<int32_t> readTokenFile(const std::string &Path, size_t Count,
                                   int64_t Vocab) {
  TokenLayout L = tokenLayout(Path);
  requireTokens(L, Count);
  TokenFile File(std::move(L));
  std::vector<int32_t> T(Count);
  File.read(0, Count, Vocab, T.data());
  return T;
}

} // namespace megac_rt
