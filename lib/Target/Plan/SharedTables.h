//===- SharedTables.h - Writing each distinct plan table once ---*- C++ -*-===//
//
// The ranks of a grid run nearly the same program. The 32 ranks of one
// pipeline stage of a dp=4, pp=8, tp=8 plan differ only in a few values:
// vocabulary starts, slice offsets, transfer peers. Within one rank, most
// buffers have one of a few shapes. A flatbuffer may refer to one table from
// many places, so the emitter writes each distinct table (instruction,
// buffer, parameter, ...) and each distinct vector of tables once, and every
// rank that has it refers to that copy. A reader sees the same plan: tables
// are values, and nothing in the runtime compares their addresses.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_LIB_TARGET_PLAN_SHAREDTABLES_H
#define MEGAC_LIB_TARGET_PLAN_SHAREDTABLES_H

#include "flatbuffers/flatbuffers.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace megac {

/// The bytes that identify one table's contents: what kind of table it is,
/// then each field in order, with the lengths of strings and vectors (so
/// that no two different tables give the same bytes).
class TableKey {
public:
  enum class Kind : char {
    Instr = 'I',
    Buffer = 'B',
    Param = 'P',
    Input = 'i',
    Output = 'o',
    Segment = 'S',
    Task = 'T',
    Vector = 'V',
  };

  explicit TableKey(Kind kind) : bytes(1, static_cast<char>(kind)) {}

  template <typename T> TableKey &scalar(T value) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>,
                  "only numbers are keyed by their bytes");
    bytes.append(reinterpret_cast<const char *>(&value), sizeof(T));
    return *this;
  }
  TableKey &text(llvm::StringRef value) {
    scalar<uint64_t>(value.size());
    bytes.append(value.data(), value.size());
    return *this;
  }
  template <typename T> TableKey &list(const std::vector<T> &values) {
    scalar<uint64_t>(values.size());
    for (const T &value : values)
      scalar(value);
    return *this;
  }
  /// Tables written earlier, by where they are in the buffer.
  template <typename T>
  TableKey &list(const std::vector<flatbuffers::Offset<T>> &values) {
    scalar<uint64_t>(values.size());
    for (flatbuffers::Offset<T> value : values)
      scalar(value.o);
    return *this;
  }

  const std::string &bytesOf() const { return bytes; }

private:
  std::string bytes;
};

/// Writes each distinct table once into one builder and hands out the
/// offset of that copy for every later table with the same key.
class SharedTables {
public:
  explicit SharedTables(flatbuffers::FlatBufferBuilder &fbb) : fbb(fbb) {}

  flatbuffers::FlatBufferBuilder &builder() { return fbb; }

  /// The table whose contents \p key describes; \p write (returning its
  /// offset) writes it the first time. \p write must not call get().
  template <typename T, typename WriteFn>
  flatbuffers::Offset<T> get(const TableKey &key, WriteFn write) {
    auto [it, added] = offsets.try_emplace(key.bytesOf(), 0);
    if (added)
      it->second = write().o;
    return flatbuffers::Offset<T>(it->second);
  }

  /// A vector of tables written earlier, shared like a table.
  template <typename T>
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<T>>>
  vector(const std::vector<flatbuffers::Offset<T>> &items) {
    TableKey key(TableKey::Kind::Vector);
    key.list(items);
    return get<flatbuffers::Vector<flatbuffers::Offset<T>>>(
        key, [&] { return fbb.CreateVector(items); });
  }

private:
  flatbuffers::FlatBufferBuilder &fbb;
  // (A StringMap keeps each key beside its value, one allocation an
  // entry: a deep model's plan holds millions, and std::unordered_map's
  // separate nodes and strings made the lookups' cache misses grow with
  // depth.)
  llvm::StringMap<uint32_t> offsets;
};

} // namespace megac

#endif // MEGAC_LIB_TARGET_PLAN_SHAREDTABLES_H
