//===- safetensors.cpp - Reading and writing .safetensors files -----------===//
//
// The header is limited to 100 MB (as the reference implementation does) so
// a corrupted length cannot make us allocate or parse gigabytes; offsets are
// checked against the actual data size and against shape * itemsize, which
// together guarantee that data(T) .. data(T)+bytes lies inside the mapping.
//
//===----------------------------------------------------------------------===//

#include "safetensors.h"
#include "error.h"
#include "file_io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <stdexcept>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace megac_rt {

namespace {
constexpr uint64_t kMaxHeader = 100ull * 1000 * 1000;

[[noreturn]] void bad(const std::string &Msg) {
  throw std::runtime_error(Msg);
}
} // namespace

uint64_t TensorInfo::numel() const {
  uint64_t N = 1;
  for (int64_t D : shape)
    N *= uint64_t(D);
  return N;
}

const TensorInfo *SafetensorsHeader::find(const std::string &Name) const {
  auto It = tensors.find(Name);
  return It == tensors.end() ? nullptr : &It->second;
}

size_t safetensorsItemSize(const std::string &D) {
  if (D == "F64" || D == "I64" || D == "U64")
    return 8;
  if (D == "F32" || D == "I32" || D == "U32")
    return 4;
  if (D == "F16" || D == "BF16" || D == "I16" || D == "U16")
    return 2;
  if (D == "I8" || D == "U8" || D == "BOOL" || D == "F8_E4M3" ||
      D == "F8_E5M2")
    return 1;
  return 0;
}

SafetensorsHeader parseSafetensors(const uint8_t *Data, size_t Size) {
  if (Size < 8)
    bad("not a safetensors file (only " + std::to_string(Size) +
        " bytes, need at least 8)");
  uint64_t N = 0;
  for (int I = 7; I >= 0; --I)
    N = (N << 8) | Data[I];
  // A file of JSON (its first byte '{' reads as a length past 2^56): a
  // sharded checkpoint's index under another name, most likely.
  if (N > kMaxHeader && Data[0] == '{')
    bad("JSON, not a safetensors file (name a sharded checkpoint's index "
        "*.index.json)");
  if (N > kMaxHeader)
    bad("safetensors header length " + std::to_string(N) +
        " exceeds the 100 MB limit (corrupted or not a safetensors file)");
  if (N > Size - 8)
    bad("safetensors header length " + std::to_string(N) +
        " runs past the end of the file (" + std::to_string(Size) +
        " bytes)");
  nlohmann::json J = nlohmann::json::parse(Data + 8, Data + 8 + N, nullptr,
                                           /*allow_exceptions=*/false);
  if (J.is_discarded())
    bad("safetensors header is not valid JSON");
  if (!J.is_object())
    bad("safetensors header is not a JSON object");

  SafetensorsHeader H;
  H.dataStart = 8 + N;
  const uint64_t DataSize = Size - 8 - N;
  for (auto It = J.begin(); It != J.end(); ++It) {
    const std::string &Name = It.key();
    if (Name == "__metadata__")
      continue;
    const nlohmann::json &E = It.value();
    std::string Pfx = "tensor \"" + Name + "\": ";
    if (!E.is_object())
      bad(Pfx + "header entry is not an object");
    TensorInfo T;
    T.name = Name;
    auto D = E.find("dtype");
    if (D == E.end() || !D->is_string())
      bad(Pfx + "missing or non-string dtype");
    T.dtype = D->get<std::string>();
    size_t Item = safetensorsItemSize(T.dtype);
    if (!Item)
      bad(Pfx + "unknown dtype \"" + T.dtype + "\"");
    auto S = E.find("shape");
    if (S == E.end() || !S->is_array())
      bad(Pfx + "missing or non-array shape");
    uint64_t Numel = 1;
    for (const auto &Dim : *S) {
      if (!Dim.is_number_integer() || Dim.get<int64_t>() < 0)
        bad(Pfx + "shape must hold non-negative integers");
      int64_t V = Dim.get<int64_t>();
      if (V && Numel > (uint64_t(1) << 48) / uint64_t(V))
        bad(Pfx + "shape is implausibly large");
      Numel *= uint64_t(V);
      T.shape.push_back(V);
    }
    auto O = E.find("data_offsets");
    if (O == E.end() || !O->is_array() || O->size() != 2 ||
        !(*O)[0].is_number_unsigned() || !(*O)[1].is_number_unsigned())
      bad(Pfx + "data_offsets must be [begin, end] with non-negative integers");
    T.begin = (*O)[0].get<uint64_t>();
    T.end = (*O)[1].get<uint64_t>();
    if (T.begin > T.end || T.end > DataSize)
      bad(Pfx + "data_offsets [" + std::to_string(T.begin) + ", " +
          std::to_string(T.end) + "] lie outside the " +
          std::to_string(DataSize) + "-byte data section");
    if (T.end - T.begin != Numel * Item)
      bad(Pfx + "holds " + std::to_string(T.end - T.begin) +
          " bytes but dtype " + T.dtype + " and its shape need " +
          std::to_string(Numel * Item));
    H.tensors.emplace(Name, std::move(T));
  }
  // Two tensors sharing bytes would each read the other's values: the
  // header of a damaged or hand-edited file.
  std::vector<const TensorInfo *> ByOffset;
  for (const auto &[Name, T] : H.tensors)
    if (T.end > T.begin)
      ByOffset.push_back(&T);
  std::sort(ByOffset.begin(), ByOffset.end(),
            [](const TensorInfo *A, const TensorInfo *B) {
              return A->begin < B->begin;
            });
  for (size_t I = 1; I < ByOffset.size(); ++I)
    if (ByOffset[I]->begin < ByOffset[I - 1]->end)
      bad("tensors \"" + ByOffset[I - 1]->name + "\" [" +
          std::to_string(ByOffset[I - 1]->begin) + ", " +
          std::to_string(ByOffset[I - 1]->end) + ") and \"" +
          ByOffset[I]->name + "\" [" + std::to_string(ByOffset[I]->begin) +
          ", " + std::to_string(ByOffset[I]->end) +
          ") share bytes of the data section: a damaged header");
  // The tensors fill the data section from its first byte to its last,
  // with no gap (as the format requires): else the header's length field
  // or an offset is off, and every tensor would be read from the wrong
  // bytes without another sign.
  uint64_t Filled = 0;
  for (const TensorInfo *T : ByOffset) {
    if (T->begin != Filled)
      bad("bytes [" + std::to_string(Filled) + ", " + std::to_string(T->begin) +
          ") of the data section belong to no "
          "tensor: a damaged header (or its length field)");
    Filled = T->end;
  }
  if (Filled != DataSize)
    bad("the data section holds " + std::to_string(DataSize) +
        " bytes but its tensors end at byte " + std::to_string(Filled) +
        ": a damaged header (or its length field), or bytes appended to the "
        "file");
  return H;
}

SafetensorsFile::SafetensorsFile(const std::string &P) : Path(P) {
  // (A pipe is refused below, not waited on for ever.)
  int Fd = openWithoutWaiting(Path);
  if (Fd < 0)
    throw RunError(Path + ": cannot open weights file: " +
                   std::strerror(errno));
  struct stat St;
  const bool Stated = ::fstat(Fd, &St) == 0;
  if (!Stated || !S_ISREG(St.st_mode)) {
    ::close(Fd);
    // (WeightFiles reads a model directory's files.)
    if (Stated && S_ISDIR(St.st_mode))
      throw RunError(Path + ": is a directory, not a safetensors file");
    throw RunError(Path + ": not a regular file");
  }
  Size = size_t(St.st_size);
  if (Size > 0) {
    void *M = ::mmap(nullptr, Size, PROT_READ, MAP_PRIVATE, Fd, 0);
    if (M == MAP_FAILED) {
      int E = errno;
      ::close(Fd);
      throw RunError(Path + ": cannot map weights file: " + std::strerror(E));
    }
    Base = static_cast<const uint8_t *>(M);
  }
  ::close(Fd);
  static const uint8_t Empty[1] = {0};
  try {
    Header = parseSafetensors(Base ? Base : Empty, Size);
  } catch (const std::exception &E) {
    if (Base)
      ::munmap(const_cast<uint8_t *>(Base), Size);
    Base = nullptr;
    throw RunError(Path + ": " + E.what());
  }
}

namespace {

/// The file --weights \p Path names: itself, or a HuggingFace model
/// directory's model.safetensors, else its index (as from_pretrained
/// looks).
std::string weightsFileOf(const std::string &Path) {
  struct stat St;
  if (::stat(Path.c_str(), &St) != 0 || !S_ISDIR(St.st_mode))
    return Path;
  for (const char *Name :
       {"/model.safetensors", "/model.safetensors.index.json"})
    if (::access((Path + Name).c_str(), F_OK) == 0)
      return Path + Name;
  throw RunError(Path + ": a directory holding neither model.safetensors "
                        "nor model.safetensors.index.json");
}

/// The shard map of the index at \p Path: tensor name -> shard path, each
/// shard a plain file name beside the index (checked whole).
std::map<std::string, std::string> readShardMap(const std::string &Path) {
  regularFileSize(Path); // (a pipe would block the stream for ever)
  std::ifstream F(Path);
  if (!F)
    throw RunError(Path +
                   ": cannot open weights index: " + std::strerror(errno));
  nlohmann::json J;
  try {
    J = nlohmann::json::parse(F);
  } catch (const std::exception &E) {
    throw RunError(Path + ": not a safetensors index (JSON): " + E.what());
  }
  if (!J.is_object() || !J.contains("weight_map") ||
      !J["weight_map"].is_object() || J["weight_map"].empty())
    throw RunError(Path + ": a safetensors index needs a non-empty "
                          "\"weight_map\" object (tensor name -> shard file)");
  const std::string Dir = parentOf(Path);
  std::map<std::string, std::string> ShardOf;
  for (const auto &[Name, Shard] : J["weight_map"].items()) {
    if (!Shard.is_string())
      throw RunError(Path + ": weight_map[\"" + Name +
                     "\"] is not a file name");
    const std::string File = Shard.get<std::string>();
    // Shards lie beside their index (as HuggingFace saves them): a path
    // elsewhere is a damaged or hostile index.
    if (File.empty() || File.find('/') != std::string::npos || File == "." ||
        File == "..")
      throw RunError(Path + ": weight_map[\"" + Name + "\"] = \"" + File +
                     "\" is not a file name beside the index");
    ShardOf[Name] = Dir + "/" + File;
  }
  return ShardOf;
}

bool isIndexName(const std::string &Path) {
  return endsWith(Path, ".index.json");
}

} // namespace

WeightFiles::WeightFiles(const std::string &P) : Path(weightsFileOf(P)) {
  if (!isIndexName(Path)) {
    Single = std::make_unique<SafetensorsFile>(Path);
    return;
  }
  ShardOf = readShardMap(Path);
}

std::vector<std::string> WeightFiles::filesOf(const std::string &P) {
  std::vector<std::string> Files = {weightsFileOf(P)};
  if (isIndexName(Files.front()))
    for (const auto &[Name, Shard] : readShardMap(Files.front()))
      if (std::find(Files.begin(), Files.end(), Shard) == Files.end())
        Files.push_back(Shard);
  return Files;
}

WeightFiles::~WeightFiles() = default;

WeightFiles::Found WeightFiles::find(const std::string &Name) const {
  if (Single) {
    const TensorInfo *T = Single->header().find(Name);
    return {T ? Single.get() : nullptr, T};
  }
  auto It = ShardOf.find(Name);
  if (It == ShardOf.end())
    return {};
  std::unique_ptr<SafetensorsFile> &Shard = Shards[It->second];
  if (!Shard)
    Shard = std::make_unique<SafetensorsFile>(It->second);
  const TensorInfo *T = Shard->header().find(Name);
  if (!T)
    throw RunError(Path + ": names " + It->second + " for tensor \"" + Name +
                   "\", which that file does not hold");
  return {Shard.get(), T};
}

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> Names;
  if (Single)
    for (const auto &[Name, Info] : Single->header().tensors)
      Names.push_back(Name);
  else
    for (const auto &[Name, Shard] : ShardOf)
      Names.push_back(Name);
  return Names;
}

SafetensorsFile::~SafetensorsFile() {
  if (Base)
    ::munmap(const_cast<uint8_t *>(Base), Size);
}

std::vector<uint8_t>
safetensorsImage(const std::vector<TensorToWrite> &Tensors,
                 const std::map<std::string, std::string> &Metadata) {
  nlohmann::json J = nlohmann::json::object();
  uint64_t Off = 0;
  for (const TensorToWrite &T : Tensors) {
    J[T.name] = {{"dtype", T.dtype},
                 {"shape", T.shape},
                 {"data_offsets", {Off, Off + T.bytes}}};
    Off += T.bytes;
  }
  if (!Metadata.empty())
    J["__metadata__"] = Metadata;
  std::string Header = J.dump(-1, ' ', false,
                              nlohmann::json::error_handler_t::replace);
  // Pad with spaces so the data section starts 8-byte aligned.
  Header.append((8 - Header.size() % 8) % 8, ' ');
  std::vector<uint8_t> Out;
  Out.reserve(8 + Header.size() + Off);
  for (int I = 0; I < 8; ++I)
    Out.push_back(uint8_t(uint64_t(Header.size()) >> (8 * I)));
  Out.insert(Out.end(), Header.begin(), Header.end());
  for (const TensorToWrite &T : Tensors) {
    const uint8_t *D = static_cast<const uint8_t *>(T.data);
    if (T.bytes)
      Out.insert(Out.end(), D, D + T.bytes);
  }
  return Out;
}

void writeSafetensors(const std::string &Path,
                      const std::vector<TensorToWrite> &Tensors,
                      const std::map<std::string, std::string> &Metadata) {
  std::vector<uint8_t> Image = safetensorsImage(Tensors, Metadata);
  writeFileAtomic(Path, Image.data(), Image.size());
}

float halfToFloat(uint16_t H) {
  uint32_t Sign = uint32_t(H & 0x8000) << 16;
  uint32_t Exp = (H >> 10) & 0x1F;
  uint32_t Man = H & 0x3FF;
  uint32_t Bits;
  if (Exp == 0) {
    if (Man == 0) {
      Bits = Sign;
    } else { // subnormal: renormalize
      int E = -1;
      do {
        ++E;
        Man <<= 1;
      } while (!(Man & 0x400));
      Bits = Sign | uint32_t(127 - 15 - E) << 23 | (Man & 0x3FF) << 13;
    }
  } else if (Exp == 31) {
    Bits = Sign | 0x7F800000u | Man << 13;
  } else {
    Bits = Sign | (Exp + 127 - 15) << 23 | Man << 13;
  }
  float F;
  std::memcpy(&F, &Bits, 4);
  return F;
}

float bf16ToFloat(uint16_t H) {
  uint32_t Bits = uint32_t(H) << 16;
  float F;
  std::memcpy(&F, &Bits, 4);
  return F;
}

} // namespace megac_rt
