//===- checkpoint.cpp - Sharded, atomic training checkpoints --------------===//
//
// See checkpoint.h. Loading trusts nothing: meta.json is parsed defensively,
// each shard's size and CRC-32 are checked before its header is parsed, and
// every tensor's dtype, shape and recorded slice must match the plan.
//
//===----------------------------------------------------------------------===//

#include "checkpoint.h"
#include "error.h"
#include "file_io.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace megac::plan;
using nlohmann::json;

namespace megac_rt {

namespace {

std::vector<int64_t> vec(const flatbuffers::Vector<int64_t> *V) {
  return V ? std::vector<int64_t>(V->begin(), V->end())
           : std::vector<int64_t>();
}

std::string listStr(const std::vector<int64_t> &S) {
  std::string R = "[";
  for (size_t I = 0; I < S.size(); ++I)
    R += (I ? "," : "") + std::to_string(S[I]);
  return R + "]";
}

std::string hex64(uint64_t V) {
  char Buf[32];
  std::snprintf(Buf, sizeof(Buf), "0x%016" PRIx64, V);
  return Buf;
}

std::string stripSlashes(std::string D) {
  while (D.size() > 1 && D.back() == '/')
    D.pop_back();
  return D;
}

std::string join(const std::string &Dir, const std::string &Name) {
  return Dir.empty() ? Name : stripSlashes(Dir) + "/" + Name;
}

/// A JSON value for a message: a number or string as written, anything
/// else by its kind (printing a deeply nested one would recurse as deep).
std::string jsonText(const json &V) {
  return V.is_primitive() ? V.dump() : std::string("a JSON ") + V.type_name();
}

/// The __metadata__ value describing where a local tensor sits.
std::string sliceJson(const std::vector<int64_t> &Global,
                      const std::vector<int64_t> &Offset) {
  return json{{"global_shape", Global}, {"offset", Offset}}.dump();
}

} // namespace

void makeDirs(const std::string &Dir) {
  std::error_code EC;
  std::filesystem::create_directories(Dir, EC);
  if (EC)
    throw RunError(Dir +
                   ": cannot create checkpoint directory: " + EC.message());
  if (!std::filesystem::is_directory(Dir, EC))
    throw RunError(Dir + ": not a directory");
}

namespace {

/// Whether test hook \p Name is set to \p Value:
/// MEGAC_TEST_CRASH_IN_SAVE=after-shards (crashHookAfterShards) or
/// =between-renames (publishStep's two renames, which
/// MEGAC_TEST_NO_RENAME_EXCHANGE=1 takes as on a file system without
/// the exchange, NFS); MEGAC_TEST_NO_FLOCK=1 (a file system without
/// locks, for lockCheckpointDirectory).
bool testHook(const char *Name, const char *Value) {
  const char *V = std::getenv(Name);
  return V && std::strcmp(V, Value) == 0;
}

/// Whether \p Name is a step directory's name: "step-" and at least 8
/// digits (stepDirName; a step past 99999999 takes more).
bool isStepDirName(const std::string &Name) {
  bool Ok = Name.size() >= 13 && Name.size() <= 24 &&
            Name.compare(0, 5, "step-") == 0;
  for (size_t I = 5; Ok && I < Name.size(); ++I)
    Ok = Name[I] >= '0' && Name[I] <= '9';
  return Ok;
}

/// Where an interrupted publishStep left step \p Name of \p Dir whole,
/// the step itself missing: its staging directory (the new step,
/// complete once it holds meta.json, written last) or the step it
/// replaced (".old"). "" where neither is.
std::string interruptedStep(const std::string &Dir, const std::string &Name) {
  for (const char *Suffix : {".partial", ".partial.old"}) {
    const std::string Where = join(Dir, "." + Name + Suffix);
    struct stat St;
    if (::stat(join(Where, "meta.json").c_str(), &St) == 0 &&
        S_ISREG(St.st_mode))
      return Where;
  }
  return "";
}

/// Rank 0, holding the lock, before it saves: moves back a step `latest`
/// names that an interrupted publish left aside, then removes what saves
/// that crashed left (staging directories, replaced steps).
void repairCheckpointDirectory(const std::string &Dir) {
  std::ifstream In(join(Dir, "latest"));
  std::string Name;
  In >> Name;
  struct stat St;
  if (isStepDirName(Name) && ::lstat(join(Dir, Name).c_str(), &St) != 0 &&
      errno == ENOENT)
    if (const std::string Found = interruptedStep(Dir, Name); !Found.empty())
      if (::rename(Found.c_str(), join(Dir, Name).c_str()) == 0)
        fsyncDir(stripSlashes(Dir));
  std::error_code EC;
  for (const auto &Entry : std::filesystem::directory_iterator(Dir, EC)) {
    const std::string File = Entry.path().filename().string();
    auto EndsWith = [&File](const std::string &End) {
      return File.size() > End.size() &&
             File.compare(File.size() - End.size(), End.size(), End) == 0;
    };
    if (File.rfind(".step-", 0) == 0 &&
        (EndsWith(".partial") || EndsWith(".partial.old"))) {
      std::error_code Ignored;
      std::filesystem::remove_all(Entry.path(), Ignored);
    }
  }
}

} // namespace

std::string lockCheckpointDirectory(const std::string &Dir) {
  const std::string Path = join(Dir, ".megac-lock");
  // 0666 less the umask: in a directory several users share, the next
  // user's run opens the file the last one left. One it cannot write it
  // locks through a read-only descriptor (flock needs none on a local
  // file system) and leaves its text alone.
  bool Writable = true;
  int Fd = ::open(Path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (Fd < 0 && errno == EACCES) {
    Writable = false;
    Fd = ::open(Path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (Fd < 0)
    throw RunError(Path + ": cannot open the checkpoint's lock file: " +
                   std::strerror(errno));
  // (Test hook: MEGAC_TEST_NO_FLOCK=1 plays a file system without locks,
  // which no file system here is.)
  const bool NoLocks = testHook("MEGAC_TEST_NO_FLOCK", "1");
  if (NoLocks || ::flock(Fd, LOCK_EX | LOCK_NB) != 0) {
    const int Err = NoLocks ? ENOLCK : errno;
    if (Err != EWOULDBLOCK) { // (ENOLCK, EOPNOTSUPP, ENOSYS, EBADF)
      ::close(Fd);
      return "--save-checkpoint " + Dir + ": its file system keeps no locks (" +
             std::strerror(Err) +
             "): nothing stops a second run from saving there at the same "
             "time";
    }
    char Holder[256] = {};
    const ssize_t N = ::pread(Fd, Holder, sizeof(Holder) - 1, 0);
    ::close(Fd);
    std::string Who(Holder, size_t(N > 0 ? N : 0));
    while (!Who.empty() && (Who.back() == '\n' || Who.back() == ' '))
      Who.pop_back();
    Who = printableText(Who);
    throw RunError("--save-checkpoint " + Dir + " is in use by another run" +
                   (Who.empty() ? "" : " (" + Who + ")") +
                   ": two runs saving into one directory would overwrite "
                   "each other's steps and its latest; wait for that run "
                   "to end, or name another directory (if that run is "
                   "gone and its host down, a network file system may "
                   "keep its lock a while: removing " +
                   Path + " frees the directory)");
  }
  // Held until the process ends, however it ends (the kernel releases
  // it); the file says who holds it.
  char Host[128] = "?";
  ::gethostname(Host, sizeof(Host) - 1);
  const std::string Who =
      "megac-run process " + std::to_string(::getpid()) + " on " + Host + "\n";
  // (Should the write fail, the holder goes unnamed; the lock stands.)
  if (Writable && ::ftruncate(Fd, 0) == 0)
    (void)!::pwrite(Fd, Who.data(), Who.size(), 0);
  repairCheckpointDirectory(Dir);
  return "";
}

std::string stepDirName(int64_t Step) {
  char Buf[32];
  std::snprintf(Buf, sizeof(Buf), "step-%08lld", (long long)Step);
  return Buf;
}

std::string stagingDirName(int64_t Step) {
  return "." + stepDirName(Step) + ".partial";
}

void prepareStepStaging(const std::string &Dir, int64_t Step) {
  const std::string Staging = join(Dir, stagingDirName(Step));
  // What a save that crashed left (the lock keeps any other saver out).
  std::error_code EC;
  std::filesystem::remove_all(Staging, EC);
  if (EC)
    throw RunError(
        Staging + ": cannot remove what an earlier save left: " + EC.message());
  makeDirs(Staging);
}

std::string shardFileName(uint32_t Rank) {
  char Buf[48];
  std::snprintf(Buf, sizeof(Buf), "rank-%05u.safetensors", Rank);
  return Buf;
}

ShardInfo writeCheckpointShard(const std::string &Dir, int64_t Step,
                               const Executor &E) {
  const RankProgram &RP = E.rankProgram();
  const std::string StepDir = join(Dir, stagingDirName(Step));
  makeDirs(StepDir);
  fsyncDir(stripSlashes(Dir));

  std::vector<TensorToWrite> Ts;
  std::map<std::string, std::string> Meta;
  Meta["format"] = "megac-checkpoint-shard 1";
  Meta["step"] = std::to_string(Step);
  Meta["rank"] = std::to_string(RP.rank());
  if (RP.params())
    for (const Param *Pa : *RP.params()) {
      const Tensor &T = E.buffer(Pa->buffer());
      std::string Name = "param/" + Pa->name()->str();
      Ts.push_back({Name, "F32", T.shape, T.data(), T.bytes()});
      Meta[Name] = sliceJson(vec(Pa->global_shape()), vec(Pa->offset()));
    }
  // Moments cover what their adam_w updates: the parameter's local slice,
  // or under ZeRO this rank's part of it (param_offset), so a dp group
  // holds each moment once.
  for (const AdamState &St : E.adamStates()) {
    const Tensor &T = E.buffer(St.buffer);
    std::string Slice = sliceJson(St.globalShape, St.offset);
    for (int K = 0; K < 2; ++K) {
      std::string Name = (K ? "adam_v/" : "adam_m/") + St.param;
      const std::vector<float> &D = K ? St.v : St.m;
      Ts.push_back({Name, "F32", T.shape, D.data(), D.size() * sizeof(float)});
      Meta[Name] = Slice;
    }
  }
  std::vector<uint8_t> Image = safetensorsImage(Ts, Meta);
  ShardInfo Info;
  Info.rank = RP.rank();
  Info.file = shardFileName(RP.rank());
  Info.bytes = Image.size();
  Info.crc32 = crc32(Image.data(), Image.size());
  writeFileAtomic(join(StepDir, Info.file), Image.data(), Image.size());
  return Info;
}

void crashHookAfterShards() {
  if (testHook("MEGAC_TEST_CRASH_IN_SAVE", "after-shards")) {
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(9);
  }
}

namespace {

/// Moves the complete step \p Staging to \p Dir/\p StepName and returns
/// what to remove once `latest` is written ("": nothing). A step of that
/// name already there (a run resumed from an earlier step, saving its
/// steps again; maybe the one `latest` names) is swapped out in one
/// rename, then removed: written over in place, a crash midway left the
/// new shards beside the old meta.json, and `latest` on a checkpoint that
/// no longer loaded. Where the file system cannot swap (NFS), two renames
/// leave a moment in which the step is missing: interruptedStep finds it
/// then, and repairCheckpointDirectory moves it back.
std::string publishStep(const std::string &Dir, const std::string &Staging,
                        const std::string &StepName) {
  const std::string Step = join(Dir, StepName);
  auto Fail = [&](const std::string &What) {
    throw RunError(Step + ": cannot " + What + ": " + std::strerror(errno));
  };
  std::string Leftover;
  struct stat St;
  if (::lstat(Step.c_str(), &St) != 0) {
    if (::rename(Staging.c_str(), Step.c_str()) != 0)
      Fail("move the saved step into place");
  } else if (!S_ISDIR(St.st_mode)) {
    throw RunError(Step + ": not a directory: something else stands where "
                          "the step is saved");
  } else if (!testHook("MEGAC_TEST_NO_RENAME_EXCHANGE", "1") &&
             ::renameat2(AT_FDCWD, Staging.c_str(), AT_FDCWD, Step.c_str(),
                         RENAME_EXCHANGE) == 0) {
    Leftover = Staging; // (now the step it replaced)
  } else {
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP &&
        !testHook("MEGAC_TEST_NO_RENAME_EXCHANGE", "1"))
      Fail("swap the saved step into place");
    const std::string Old = Staging + ".old";
    std::error_code EC;
    std::filesystem::remove_all(Old, EC);
    if (::rename(Step.c_str(), Old.c_str()) != 0)
      Fail("move the step it replaces aside");
    if (testHook("MEGAC_TEST_CRASH_IN_SAVE", "between-renames"))
      ::_exit(9);
    if (::rename(Staging.c_str(), Step.c_str()) != 0) {
      const int Err = errno;
      ::rename(Old.c_str(), Step.c_str()); // (the old step back)
      errno = Err;
      Fail("move the saved step into place");
    }
    Leftover = Old;
  }
  fsyncDir(stripSlashes(Dir));
  return Leftover;
}

} // namespace

void writeCheckpointMeta(const std::string &Dir, const CheckpointMeta &M) {
  const std::string StepName = stepDirName(M.step);
  json Shards = json::array();
  for (const ShardInfo &S : M.shards)
    Shards.push_back({{"rank", S.rank},
                      {"file", S.file},
                      {"bytes", S.bytes},
                      {"crc32", S.crc32}});
  json J = {{"format", 1},
            {"step", M.step},
            {"data_position", M.dataPosition},
            {"seed", M.seed},
            {"world_size", M.worldSize},
            {"grid", M.grid},
            {"model_hash", M.modelHash},
            {"shards", Shards}};
  if (M.hasData)
    J["data"] = {{"file", M.dataFile},
                 {"tokens", M.dataTokens},
                 {"crc32", M.dataCrc},
                 {"sample", M.sample}};
  if (!M.arithmetic.empty())
    J["arithmetic"] = M.arithmetic;
  std::string Text = J.dump(2) + "\n";
  const std::string Staging = join(Dir, stagingDirName(M.step));
  writeFileAtomic(join(Staging, "meta.json"), Text.data(), Text.size());
  const std::string Leftover = publishStep(Dir, Staging, StepName);
  std::string Latest = StepName + "\n";
  writeFileAtomic(join(Dir, "latest"), Latest.data(), Latest.size());
  // (What cannot be removed now, the next run's lock removes.)
  std::error_code EC;
  if (!Leftover.empty())
    std::filesystem::remove_all(Leftover, EC);
}

namespace {

/// Steps beyond this are no run's (2^40 steps per run, and then some):
/// a meta.json that says more was edited, and its sums would overflow.
constexpr int64_t kMaxCheckpointStep = int64_t(1) << 50;

/// Whether two gridString()s lay out the same ranks: axes of size 1 split
/// nothing, so "dp=1 x tp=2" and "tp=2" hold the same shards.
bool sameGrid(const std::string &A, const std::string &B) {
  auto Split = [](const std::string &G) {
    std::vector<std::string> Axes;
    if (G == "single")
      return Axes;
    for (size_t At = 0; At <= G.size();) {
      size_t End = G.find(" x ", At);
      if (End == std::string::npos)
        End = G.size();
      const std::string Axis = G.substr(At, End - At);
      if (Axis.size() < 2 || Axis.compare(Axis.size() - 2, 2, "=1") != 0)
        Axes.push_back(Axis);
      At = End + 3;
    }
    return Axes;
  };
  return Split(A) == Split(B);
}

} // namespace

CheckpointMeta readCheckpointMeta(const std::string &DirIn, const Program &P,
                                  std::string &StepDir) {
  const std::string Dir = stripSlashes(DirIn);
  struct stat St;
  if (::stat(Dir.c_str(), &St) != 0)
    throw RunError(Dir + ": checkpoint directory does not exist");
  if (!S_ISDIR(St.st_mode))
    throw RunError(Dir + ": not a directory (a checkpoint is the directory "
                         "--save-checkpoint wrote)");
  bool Missing;
  // (latest names a step directory; meta.json lists a shard per rank.)
  std::vector<uint8_t> Latest = readRegularFile(
      join(Dir, "latest"), Missing, 4096, "a step directory's name takes");
  if (!Missing) {
    std::string Name(Latest.begin(), Latest.end());
    while (!Name.empty() && (Name.back() == '\n' || Name.back() == '\r' ||
                             Name.back() == ' '))
      Name.pop_back();
    if (!isStepDirName(Name))
      throw RunError(join(Dir, "latest") +
                     ": does not name a step directory (step-NNNNNNNN)");
    StepDir = join(Dir, Name);
    // A save interrupted between publishStep's two renames (NFS) left
    // the step aside, whole.
    struct stat Step;
    if (::lstat(StepDir.c_str(), &Step) != 0 && errno == ENOENT)
      if (const std::string Found = interruptedStep(Dir, Name); !Found.empty())
        StepDir = Found;
  } else {
    StepDir = Dir;
  }
  const std::string MetaPath = join(StepDir, "meta.json");
  std::vector<uint8_t> Text = readRegularFile(
      MetaPath, Missing, uint64_t(1) << 30, "a checkpoint's meta.json takes");
  if (Missing)
    throw RunError(Missing && StepDir == Dir
                       ? Dir + ": not a checkpoint (no latest file and no "
                               "meta.json)"
                       : MetaPath + ": missing (incomplete checkpoint)");
  json J = json::parse(Text.begin(), Text.end(), nullptr, false);
  if (J.is_discarded() || !J.is_object())
    throw RunError(MetaPath + ": not valid JSON");
  CheckpointMeta M;
  try {
    if (!J.at("format").is_number_unsigned() ||
        J.at("format").get<uint64_t>() != 1)
      throw RunError(MetaPath + ": checkpoint format " +
                     jsonText(J.at("format")) +
                     " is not supported (expected 1)");
    const json &Step = J.at("step");
    if (!Step.is_number_integer() ||
        (Step.is_number_unsigned()
             ? Step.get<uint64_t>() > uint64_t(kMaxCheckpointStep)
             : Step.get<int64_t>() < 0))
      throw RunError(MetaPath + ": step " + jsonText(Step) +
                     " is not a step a run saves (a whole number from 0 to " +
                     std::to_string(kMaxCheckpointStep) + ")");
    M.step = Step.get<int64_t>();
    // A count, a rank or a sum is a whole number that fits its field
    // (nlohmann would take false, 1e30 or -1 and make some number of it).
    auto Whole = [&](const json &Obj, const char *Key, uint64_t Max) {
      const json &V = Obj.at(Key);
      if (!V.is_number_unsigned() || V.get<uint64_t>() > Max)
        throw RunError(MetaPath + ": " + Key + " " + jsonText(V) +
                       " is not a whole number from 0 to " +
                       std::to_string(Max));
      return V.get<uint64_t>();
    };
    const uint64_t U32 = UINT32_MAX, U64 = UINT64_MAX;
    M.dataPosition = Whole(J, "data_position", U64);
    M.seed = Whole(J, "seed", U64);
    M.worldSize = uint32_t(Whole(J, "world_size", U32));
    M.grid = J.at("grid").get<std::string>();
    M.modelHash = Whole(J, "model_hash", U64);
    for (const json &S : J.at("shards")) {
      ShardInfo I;
      I.rank = uint32_t(Whole(S, "rank", U32));
      I.file = S.at("file").get<std::string>();
      I.bytes = Whole(S, "bytes", U64);
      I.crc32 = uint32_t(Whole(S, "crc32", U32));
      M.shards.push_back(I);
    }
    if (J.contains("data")) {
      const json &D = J.at("data");
      M.hasData = true;
      M.dataFile = D.at("file").get<std::string>();
      M.dataTokens = Whole(D, "tokens", U64);
      M.sample = D.at("sample").get<std::string>();
      if (D.contains("crc32")) {
        M.hasDataCrc = true;
        M.dataCrc = uint32_t(Whole(D, "crc32", U32));
      }
    }
    if (J.contains("arithmetic"))
      M.arithmetic = J.at("arithmetic").get<std::string>();
  } catch (const RunError &) {
    throw;
  } catch (const std::exception &) {
    throw RunError(MetaPath + ": missing or malformed fields");
  }
  // The directory's name and meta.json say the same step, or one of them
  // was edited or copied over from another checkpoint.
  const std::string DirName = StepDir.substr(StepDir.find_last_of('/') + 1);
  if (isStepDirName(DirName) && DirName != stepDirName(M.step))
    throw RunError(MetaPath + ": says step " + std::to_string(M.step) +
                   " but its directory is " + DirName);
  if (M.worldSize != P.world_size())
    throw RunError(MetaPath + ": checkpoint was saved by " +
                   std::to_string(M.worldSize) + " ranks but the plan has " +
                   std::to_string(P.world_size()) +
                   ": a checkpoint resumes only on the grid that saved it "
                   "(utils/merge_checkpoint.py merges one into a single file "
                   "to compare runs across grids)");
  if (!sameGrid(M.grid, gridString(P)))
    throw RunError(MetaPath + ": checkpoint grid " + printableText(M.grid) +
                   " does not match the plan's grid " + gridString(P));
  if (M.modelHash != P.model_hash())
    throw RunError(MetaPath + ": checkpoint is for model hash " +
                   hex64(M.modelHash) + " but the plan's model hash is " +
                   hex64(P.model_hash()));
  if (M.shards.size() != M.worldSize)
    throw RunError(MetaPath + ": lists " + std::to_string(M.shards.size()) +
                   " shards for " + std::to_string(M.worldSize) + " ranks");
  for (size_t R = 0; R < M.shards.size(); ++R)
    if (M.shards[R].rank != R || M.shards[R].file != shardFileName(uint32_t(R)))
      throw RunError(MetaPath + ": shard entry " + std::to_string(R) +
                     " is not " + shardFileName(uint32_t(R)));
  return M;
}

void loadCheckpointShard(const std::string &StepDir, const CheckpointMeta &M,
                         Executor &E, bool WithMoments) {
  const RankProgram &RP = E.rankProgram();
  const ShardInfo &Info = M.shards.at(RP.rank());
  const std::string Path = join(StepDir, Info.file);
  const std::string Shard = "checkpoint shard " + Path;
  // (The size is checked before anything is read.)
  const int64_t Size = regularFileSize(Path);
  if (Size < 0)
    throw RunError(Shard + " is missing");
  if (uint64_t(Size) != Info.bytes)
    throw RunError(Shard + " is corrupted (size " + std::to_string(Size) +
                   " bytes, expected " + std::to_string(Info.bytes) + ")");
  bool Missing;
  std::vector<uint8_t> Bytes =
      readRegularFile(Path, Missing, Info.bytes, "meta.json records");
  if (Missing)
    throw RunError(Shard + " is missing");
  if (crc32(Bytes.data(), Bytes.size()) != Info.crc32)
    throw RunError(Shard + " is corrupted (crc32 mismatch)");
  SafetensorsHeader H;
  try {
    H = parseSafetensors(Bytes.data(), Bytes.size());
  } catch (const std::exception &Ex) {
    throw RunError(Shard + ": " + Ex.what());
  }
  // The __metadata__ block, for the recorded slice of each tensor.
  json Hdr;
  const json *Meta = nullptr;
  {
    uint64_t N = 0;
    for (int I = 7; I >= 0; --I)
      N = (N << 8) | Bytes[size_t(I)];
    Hdr = json::parse(Bytes.begin() + 8, Bytes.begin() + 8 + long(N), nullptr,
                      false);
    // (Held, not copied: a copy of a deeply nested value recurses as deep.)
    if (Hdr.is_object() && Hdr.contains("__metadata__") &&
        Hdr["__metadata__"].is_object())
      Meta = &Hdr["__metadata__"];
  }
  auto Load = [&](const std::string &Name,
                  const std::vector<int64_t> &Global,
                  const std::vector<int64_t> &Offset, float *Dst,
                  const std::vector<int64_t> &Shape) {
    const TensorInfo *T = H.find(Name);
    // The grid matched (readCheckpointMeta), so on a pipeline the stages
    // hold other layers: another schedule or --virtual-stages.
    if (!T)
      throw RunError(Shard + " has no tensor " + Name +
                     (E.program().pipeline_stages() > 1
                          ? " (the plan that saved it split the layers "
                            "into other pipeline stages: resume with the "
                            "schedule and --virtual-stages that saved it)"
                          : ""));
    // Moments of another shape: most likely ZeRO on one side only (a
    // ZeRO rank keeps 1/dp of each moment), which the shapes alone hide.
    const bool Moment = Name.rfind("adam_", 0) == 0;
    if (T->dtype != "F32" || T->shape != Shape)
      throw RunError(Shard + ": tensor " + Name + " is " + T->dtype + " " +
                     listStr(T->shape) + " but the plan needs F32 " +
                     listStr(Shape) +
                     (Moment && T->dtype == "F32"
                          ? " (a checkpoint saved with --zero 1 loads only "
                            "into a ZeRO plan of the same grid, and one "
                            "saved without only into a plan without)"
                          : ""));
    std::string Want = sliceJson(Global, Offset);
    // (A recorded slice that is not JSON at all is no match either.)
    if (Meta && Meta->contains(Name) && (*Meta)[Name].is_string()) {
      const std::string &Recorded =
          (*Meta)[Name].get_ref<const std::string &>();
      const json Slice = json::parse(Recorded, nullptr, false);
      if (Slice.is_discarded() || Slice != json::parse(Want))
        throw RunError(Shard + ": tensor " + Name + " is the slice " +
                       Recorded + " but the plan needs " + Want);
    }
    std::memcpy(Dst, Bytes.data() + H.dataStart + T->begin,
                size_t(T->end - T->begin));
  };
  if (RP.params())
    for (const Param *Pa : *RP.params()) {
      Tensor &T = E.mutableBuffer(Pa->buffer());
      Load("param/" + Pa->name()->str(), vec(Pa->global_shape()),
           vec(Pa->offset()), T.f.data(), T.shape);
    }
  if (WithMoments)
    for (AdamState &St : E.adamStates()) {
      const std::vector<int64_t> &Shape = E.buffer(St.buffer).shape;
      Load("adam_m/" + St.param, St.globalShape, St.offset, St.m.data(),
           Shape);
      Load("adam_v/" + St.param, St.globalShape, St.offset, St.v.data(),
           Shape);
    }
  // (megac-run saves no such state; another tool, or an older run, may.)
  if (std::string Err = nonFiniteState(E); !Err.empty())
    throw RunError(Shard + ": " + Err +
                   ": the checkpoint was saved after training diverged");
}

bool isCheckpointFile(const std::string &Path, const std::string &Dir) {
  std::error_code Ec;
  const std::filesystem::path Top =
      std::filesystem::canonical(stripSlashes(Dir), Ec);
  if (Ec)
    return false; // (nothing there yet to overwrite)
  // Where the write lands: the real directory it goes into, and the name.
  const std::filesystem::path Target(writeTarget(Path));
  const std::filesystem::path Into = std::filesystem::canonical(
      Target.has_parent_path() ? Target.parent_path() : ".", Ec);
  if (Ec)
    return false;
  const std::string Name = Target.filename().string();
  // Dir itself may be a step directory: by its name, or as a resume loads
  // one of any name (a meta.json and no latest). A file named as a step
  // directory would keep the run from saving that step.
  if (Into == Top)
    return Name == "latest" || Name == ".megac-lock" || isStepDirName(Name) ||
           Name.rfind(".step-", 0) == 0 || // (a staging directory)
           isStepDirName(Top.filename().string()) ||
           (std::filesystem::exists(Top / "meta.json", Ec) &&
            !std::filesystem::exists(Top / "latest", Ec));
  const std::string IntoName = Into.filename().string();
  return Into.parent_path() == Top &&
         (isStepDirName(IntoName) || IntoName.rfind(".step-", 0) == 0);
}

} // namespace megac_rt
