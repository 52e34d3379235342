//===- safetensors.h - Reading and writing .safetensors files -*- C++ -*-===//
//
// A small, paranoid implementation of the safetensors format: an 8-byte
// little-endian header length, a JSON header mapping tensor names to
// {dtype, shape, data_offsets}, then the raw data. Weight files come from
// outside, so every field is validated before any byte of data is touched.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_SAFETENSORS_H
#define MEGAC_RT_SAFETENSORS_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace megac_rt {

struct TensorInfo {
  std::string name;
  std::string dtype; // "F32", "F16", "BF16", "I32", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0; // relative to the start of the data section
  uint64_t numel() const;
};

struct SafetensorsHeader {
  std::map<std::string, TensorInfo> tensors;
  uint64_t dataStart = 0; // absolute file offset of the data section
  const TensorInfo *find(const std::string &Name) const;
};

/// Bytes per element of a safetensors dtype, 0 if unknown.
size_t safetensorsItemSize(const std::string &DType);

/// Parses and validates the header of a safetensors image of \p Size bytes.
/// Throws std::runtime_error with a one-line message (no file name).
SafetensorsHeader parseSafetensors(const uint8_t *Data, size_t Size);

/// A read-only memory mapping of a safetensors file with its parsed header.
class SafetensorsFile {
public:
  /// Throws RunError "<path>: <what>".
  explicit SafetensorsFile(const std::string &Path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;

  const SafetensorsHeader &header() const { return Header; }
  const std::string &path() const { return Path; }
  const uint8_t *data(const TensorInfo &T) const {
    return Base + Header.dataStart + T.begin;
  }

private:
  std::string Path;
  const uint8_t *Base = nullptr;
  size_t Size = 0;
  SafetensorsHeader Header;
};

/// The weights --weights names: one safetensors file, or a checkpoint
/// sharded as HuggingFace saves large ones, named by its index
/// (model.safetensors.index.json: "weight_map" from each tensor's name to
/// the shard file holding it, beside the index). Shards are opened at
/// their first use.
class WeightFiles {
public:
  /// \p Path: a safetensors file, an index, or a HuggingFace model
  /// directory (its model.safetensors, else its index). Throws RunError
  /// "<path>: <what>" (the index is checked whole: every shard a plain file
  /// name beside it).
  explicit WeightFiles(const std::string &Path);
  ~WeightFiles();
  /// The files --weights \p Path reads, without opening the weights: the
  /// safetensors file, or the index and each of its shards (a model
  /// directory's file in its place). For the check that no output of the
  /// run overwrites one. Throws as the constructor does.
  static std::vector<std::string> filesOf(const std::string &Path);
  struct Found {
    const SafetensorsFile *file = nullptr; // null: no tensor of that name
    const TensorInfo *tensor = nullptr;
  };
  /// The tensor \p Name and the file holding it. Throws RunError where
  /// the index names a shard that does not hold it.
  Found find(const std::string &Name) const;
  /// Every tensor's name.
  std::vector<std::string> names() const;
  /// The file or index read (in a directory, the one found there).
  const std::string &path() const { return Path; }

private:
  std::string Path;
  std::unique_ptr<SafetensorsFile> Single;
  std::map<std::string, std::string> ShardOf; // tensor -> shard path
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> Shards;
};

struct TensorToWrite {
  std::string name;
  std::string dtype; // "F32" or "I32"
  std::vector<int64_t> shape;
  const void *data = nullptr;
  size_t bytes = 0;
};

/// The bytes of a safetensors file holding \p Tensors (header padded so
/// that the data section starts 8-byte aligned).
std::vector<uint8_t>
safetensorsImage(const std::vector<TensorToWrite> &Tensors,
                 const std::map<std::string, std::string> &Metadata);

/// Writes \p Tensors to \p Path whole (writeFileAtomic), so a reader
/// never sees a half-written file. Throws RunError "<path>: <what>".
void writeSafetensors(const std::string &Path,
                      const std::vector<TensorToWrite> &Tensors,
                      const std::map<std::string, std::string> &Metadata);

/// Converts IEEE half and bfloat16 bit patterns to float.
float halfToFloat(uint16_t H);
float bf16ToFloat(uint16_t H);

} // namespace megac_rt

#endif // MEGAC_RT_SAFETENSORS_H
