//===- Schedule.cpp - Pipeline schedules and their static check -----------===//

#include "megac/Pipeline/Schedule.h"

#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace megac {

PipelineSchedule buildPipelineSchedule(PipelineKind Kind, int64_t Stages,
                                       int64_t MicroBatches,
                                       int64_t VirtualStages,
                                       std::string &Error) {
  PipelineSchedule S;
  const int64_t P = Stages, M = MicroBatches;
  const int64_t V = Kind == PipelineKind::Interleaved ? VirtualStages : 1;
  if (P < 1 || M < 1 || V < 1) {
    Error = "stages, micro-batches and virtual stages must be positive";
    return S;
  }
  if (P > kMaxScheduleTasks || M > kMaxScheduleTasks || V > kMaxScheduleTasks ||
      2 * P * M > kMaxScheduleTasks / V) {
    Error = std::to_string(P) + " stages x " + std::to_string(M) +
            " micro-batches x " + std::to_string(V) +
            " chunk(s) make more than " + std::to_string(kMaxScheduleTasks) +
            " pipeline tasks";
    return S;
  }
  if (Kind == PipelineKind::Interleaved && M % P != 0) {
    Error = "the interleaved schedule needs the micro-batches (" +
            std::to_string(M) + ") to be a multiple of the stages (" +
            std::to_string(P) + ")";
    return S;
  }
  S.stages = P;
  S.microBatches = M;
  S.virtualStages = V;
  S.ranks.assign(size_t(P), {});
  for (int64_t R = 0; R < P; ++R) {
    auto &Tasks = S.ranks[size_t(R)];
    auto F = [&](int64_t I, int64_t C) { Tasks.push_back({false, I, C}); };
    auto B = [&](int64_t I, int64_t C) { Tasks.push_back({true, I, C}); };
    if (Kind == PipelineKind::GPipe) {
      // All forwards, then all backwards.
      for (int64_t I = 0; I < M; ++I)
        F(I, 0);
      for (int64_t I = 0; I < M; ++I)
        B(I, 0);
      continue;
    }
    // 1F1B (and its interleaved form, Narayanan et al. 2021): a warm-up of
    // forwards, then one forward and one backward in turn, then the rest
    // of the backwards. The k-th forward of a rank is micro-batch
    // (k / (p v)) p + k % p of chunk (k / p) % v; backwards visit the
    // chunks in reverse.
    const int64_t Total = M * V;
    int64_t Warmup = Kind == PipelineKind::OneFOneB
                         ? P - R - 1
                         : (P - R - 1) * 2 + (V - 1) * P;
    Warmup = std::min(Warmup, Total);
    auto microOf = [&](int64_t K) { return (K / (P * V)) * P + K % P; };
    auto forwardChunk = [&](int64_t K) { return (K / P) % V; };
    auto backwardChunk = [&](int64_t K) { return V - 1 - (K / P) % V; };
    int64_t NextF = 0, NextB = 0;
    for (; NextF < Warmup; ++NextF)
      F(microOf(NextF), forwardChunk(NextF));
    while (NextF < Total) {
      F(microOf(NextF), forwardChunk(NextF));
      ++NextF;
      B(microOf(NextB), backwardChunk(NextB));
      ++NextB;
    }
    for (; NextB < Total; ++NextB)
      B(microOf(NextB), backwardChunk(NextB));
  }
  return S;
}

std::string formatTask(const PipelineTask &T) {
  std::string Text = (T.backward ? "B" : "F") + std::to_string(T.microBatch);
  if (T.chunk != 0)
    Text += "." + std::to_string(T.chunk);
  return Text;
}

/// \p Word as a message quotes it: at most 32 characters, and a byte that
/// is not printable as \xNN (a schedule file of binary data, or with
/// terminal escapes, is not echoed raw).
static std::string quoteWord(llvm::StringRef Word) {
  constexpr size_t kShown = 32;
  std::string Text = "'";
  for (char C : Word.take_front(kShown)) {
    if (llvm::isPrint(C))
      Text += C;
    else
      Text += "\\x" + llvm::utohexstr(uint8_t(C), /*LowerCase=*/true, 2);
  }
  return Text + (Word.size() > kShown ? "...'" : "'");
}

bool parsePipelineSchedule(llvm::StringRef Text, PipelineSchedule &S,
                           std::string &Error) {
  S = PipelineSchedule();
  llvm::SmallVector<llvm::StringRef> Lines;
  Text.split(Lines, '\n');
  int64_t MaxMicro = -1, MaxChunk = 0, Count = 0;
  for (auto [Index, Raw] : llvm::enumerate(Lines)) {
    llvm::StringRef Line = Raw.trim();
    if (Line.empty() || Line.starts_with("#"))
      continue;
    const std::string Where = "line " + std::to_string(Index + 1);
    // `megac schedule --print` labels each line "rank N:"; the label must
    // name the line's own rank.
    // (Tabs separate the label's words and the tasks as spaces do.)
    if (Line.starts_with("rank") && Line.size() > 4 && llvm::isSpace(Line[4])) {
      Line = Line.drop_front(4);
      if (!Line.contains(':')) {
        Error = Where + ": expected 'rank N:' before the tasks";
        return false;
      }
      auto [Label, Rest] = Line.split(':');
      int64_t Labelled = -1;
      if (Label.trim().getAsInteger(10, Labelled) ||
          Labelled != int64_t(S.ranks.size())) {
        Error = Where + " holds rank " + std::to_string(S.ranks.size()) +
                "'s tasks but is labelled " +
                quoteWord(("rank " + Label.trim()).str());
        return false;
      }
      Line = Rest;
      if (Line.trim().empty()) {
        Error = Where + ": rank " + std::to_string(S.ranks.size()) +
                " has no tasks (each rank runs every micro-batch forward "
                "and backward)";
        return false;
      }
    }
    std::vector<PipelineTask> Tasks;
    llvm::SmallVector<llvm::StringRef> Words;
    llvm::SplitString(Line, Words, " \t\v\f\r");
    for (llvm::StringRef Word : Words) {
      PipelineTask T;
      llvm::StringRef Rest = Word;
      const std::string NotATask =
          "rank " + std::to_string(S.ranks.size()) + ": " + quoteWord(Word) +
          " is not a task (F<micro-batch>[.<chunk>] or B...)";
      if (Rest.consume_front("F"))
        T.backward = false;
      else if (Rest.consume_front("B"))
        T.backward = true;
      else {
        Error = NotATask;
        return false;
      }
      auto [Micro, Chunk] = Rest.split('.');
      const bool Dotted = Rest.contains('.');
      if (Micro.getAsInteger(10, T.microBatch) || T.microBatch < 0 ||
          (Dotted && (Chunk.getAsInteger(10, T.chunk) || T.chunk < 0))) {
        Error = NotATask;
        return false;
      }
      // (Before anything is sized by them: the counts come from the
      // largest numbers.)
      if (T.microBatch >= kMaxScheduleTasks || T.chunk >= kMaxScheduleTasks ||
          ++Count > kMaxScheduleTasks) {
        Error = "rank " + std::to_string(S.ranks.size()) + ": " +
                quoteWord(Word) + ": a schedule holds at most " +
                std::to_string(kMaxScheduleTasks) +
                " tasks, and its micro-batch and chunk numbers lie below "
                "that";
        return false;
      }
      MaxMicro = std::max(MaxMicro, T.microBatch);
      MaxChunk = std::max(MaxChunk, T.chunk);
      Tasks.push_back(T);
    }
    S.ranks.push_back(std::move(Tasks));
  }
  if (S.ranks.empty()) {
    Error = "the schedule has no ranks";
    return false;
  }
  // The counts are the largest indices plus one, so every index below
  // them must appear: a gap is a missing micro-batch (or chunk), not a
  // larger count.
  llvm::SmallVector<bool> MicroSeen(MaxMicro + 1), ChunkSeen(MaxChunk + 1);
  for (const std::vector<PipelineTask> &Tasks : S.ranks)
    for (const PipelineTask &T : Tasks) {
      MicroSeen[T.microBatch] = true;
      ChunkSeen[T.chunk] = true;
    }
  for (auto [Seen, What, Max] :
       {std::tuple{&MicroSeen, "micro-batch", MaxMicro},
        std::tuple{&ChunkSeen, "chunk", MaxChunk}})
    for (auto [Index, Present] : llvm::enumerate(*Seen))
      if (!Present) {
        Error = std::string("no task runs ") + What + " " +
                std::to_string(Index) + ", yet " + What + " " +
                std::to_string(Max) + " does (they are numbered from 0)";
        return false;
      }
  S.stages = int64_t(S.ranks.size());
  S.microBatches = MaxMicro + 1;
  S.virtualStages = MaxChunk + 1;
  return true;
}

bool simulatePipeline(const PipelineSchedule &S, double ForwardTime,
                      double BackwardTime, PipelineTiming &Timing,
                      std::string &Error) {
  const int64_t P = S.stages, M = S.microBatches, V = S.virtualStages;
  const int64_t Chunks = P * V;
  // Completion time of (backward, micro-batch, model chunk); -1: not yet.
  std::map<std::tuple<bool, int64_t, int64_t>, double> Done;
  // Each rank must run each of its tasks exactly once.
  for (int64_t R = 0; R < P; ++R) {
    std::map<std::tuple<bool, int64_t, int64_t>, int> Seen;
    for (const PipelineTask &T : S.ranks[size_t(R)]) {
      if (T.microBatch >= M || T.chunk >= V) {
        Error = "rank " + std::to_string(R) + " runs " + formatTask(T) +
                ", outside the schedule's micro-batches and chunks";
        return false;
      }
      if (++Seen[{T.backward, T.microBatch, T.chunk}] > 1) {
        Error = "rank " + std::to_string(R) + " runs " + formatTask(T) + " twice";
        return false;
      }
    }
    // Every task, before their order: a missing one (or a stray chunk
    // number, which makes every rank's chunks count) is named as such.
    for (int64_t Chunk = 0; Chunk < V; ++Chunk)
      for (bool Backward : {false, true})
        for (int64_t Micro = 0; Micro < M; ++Micro)
          if (!Seen.count({Backward, Micro, Chunk})) {
            Error = "rank " + std::to_string(R) + " never runs " +
                    formatTask({Backward, Micro, Chunk}) + ": each rank runs " +
                    std::to_string(M) +
                    " micro-batches forward and backward through each of "
                    "its " +
                    std::to_string(V) + " chunk(s)" +
                    (V > 1 ? " (chunks .0 to ." + std::to_string(V - 1) +
                                 ", as the highest chunk number says)"
                           : std::string());
            return false;
          }
    // Each pass of a chunk takes the micro-batches in order: the step's
    // sums (loss, gradients) start at micro-batch 0 and add the others.
    std::map<std::pair<bool, int64_t>, int64_t> Last;
    for (const PipelineTask &T : S.ranks[size_t(R)]) {
      auto [It, First] = Last.try_emplace({T.backward, T.chunk}, -1);
      if (T.microBatch != It->second + 1) {
        Error = "rank " + std::to_string(R) + " runs " + formatTask(T) +
                " out of order: each chunk's forward and backward passes "
                "take the micro-batches in order (0, 1, ...), since the "
                "step's sums start at micro-batch 0";
        return false;
      }
      It->second = T.microBatch;
    }
  }
  auto modelChunk = [&](int64_t R, int64_t Chunk) { return Chunk * P + R; };
  auto rankOf = [&](int64_t C) { return C % P; };
  std::vector<size_t> Next(size_t(P), 0);
  std::vector<double> Clock(size_t(P), 0), Busy(size_t(P), 0);
  const double TF = ForwardTime / double(V), TB = BackwardTime / double(V);
  // Ranks run their tasks in order until one waits for a message; a rank
  // whose neighbour (the owner of the model chunk before or after one of
  // its own) ran something may go on. Only those are tried again, so the
  // simulation is linear in the tasks, not in tasks x stages.
  std::vector<int64_t> Work;
  std::vector<char> Queued(size_t(P), 1);
  for (int64_t R = P - 1; R >= 0; --R)
    Work.push_back(R);
  while (!Work.empty()) {
    const int64_t R = Work.back();
    Work.pop_back();
    Queued[size_t(R)] = 0;
    const auto &Tasks = S.ranks[size_t(R)];
    bool Ran = false;
    while (Next[size_t(R)] < Tasks.size()) {
      const PipelineTask &T = Tasks[Next[size_t(R)]];
      const int64_t C = modelChunk(R, T.chunk);
      // What the task receives or needs first.
      std::tuple<bool, int64_t, int64_t> Needs[2];
      int NumNeeds = 0;
      if (!T.backward && C > 0)
        Needs[NumNeeds++] = {false, T.microBatch, C - 1};
      if (T.backward) {
        Needs[NumNeeds++] = {false, T.microBatch, C};
        if (C + 1 < Chunks)
          Needs[NumNeeds++] = {true, T.microBatch, C + 1};
      }
      double Start = Clock[size_t(R)];
      bool Ready = true;
      for (int I = 0; I < NumNeeds && Ready; ++I) {
        auto It = Done.find(Needs[I]);
        Ready = It != Done.end();
        if (Ready)
          Start = std::max(Start, It->second);
      }
      if (!Ready)
        break;
      const double Dur = T.backward ? TB : TF;
      Clock[size_t(R)] = Start + Dur;
      Busy[size_t(R)] += Dur;
      Done[{T.backward, T.microBatch, C}] = Start + Dur;
      ++Next[size_t(R)];
      Ran = true;
    }
    if (Ran)
      for (int64_t N : {(R + P - 1) % P, (R + 1) % P})
        if (!Queued[size_t(N)]) {
          Queued[size_t(N)] = 1;
          Work.push_back(N);
        }
  }
  bool Finished = true;
  for (int64_t R = 0; R < P; ++R)
    Finished &= Next[size_t(R)] >= S.ranks[size_t(R)].size();
  if (!Finished) {
    // Every rank that has work left waits for a message no one can send.
    Error = "the schedule deadlocks:";
    for (int64_t R = 0; R < P; ++R) {
      const auto &Tasks = S.ranks[size_t(R)];
      if (Next[size_t(R)] >= Tasks.size())
        continue;
      const PipelineTask &T = Tasks[Next[size_t(R)]];
      const int64_t C = modelChunk(R, T.chunk);
      std::string Wait;
      if (!T.backward)
        Wait = "the activation of micro-batch " + std::to_string(T.microBatch) +
               " from rank " + std::to_string(rankOf(C - 1));
      else if (!Done.count({false, T.microBatch, C}))
        Wait = "its own forward of micro-batch " + std::to_string(T.microBatch);
      else
        Wait = "the gradient of micro-batch " + std::to_string(T.microBatch) +
               " from rank " + std::to_string(rankOf(C + 1));
      Error += " rank " + std::to_string(R) + " waits to run " + formatTask(T) +
               " for " + Wait + ";";
    }
    Error.pop_back();
    return false;
  }
  Timing.makespan = *std::max_element(Clock.begin(), Clock.end());
  double Idle = 0, Ideal = 0;
  for (int64_t R = 0; R < P; ++R) {
    Idle += Timing.makespan - Busy[size_t(R)];
    Ideal += Busy[size_t(R)];
  }
  Timing.bubbleOfTotal = Idle / (Timing.makespan * double(P));
  Timing.bubbleOfIdeal = Ideal > 0 ? Idle / Ideal : 0;
  return true;
}

} // namespace megac
