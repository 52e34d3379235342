//===- pipeline_check.cpp - Every send received, in an order that finishes ===//
//
// Runs every rank's pipeline transfers in the order its schedule runs its
// segments (then its once-per-step part): a send goes out at once (the
// runtime stages it and does not wait), a receive waits for the matching
// send. If some rank can never go on, the plan would deadlock; the message
// names the waiting ranks and what they wait for.
//
//===----------------------------------------------------------------------===//

#include "megac_rt/plan_file.h"
#include "megac_rt/trace.h"
#include "plan_enums.h"

#include <algorithm>
#include <map>
#include <tuple>

using namespace megac::plan;

namespace megac_rt {

namespace {

struct Event {
  bool send;
  int64_t peer, transfer, micro;
  uint32_t instr;
  std::string where; // "the backward pass of stage 3 on micro-batch 1"
};

std::string taskText(const Segment *S, int64_t Micro) {
  if (!S)
    return "the once-per-step part";
  return std::string(S->backward() ? "the backward" : "the forward") +
         " pass of stage " + std::to_string(S->stage()) + " on micro-batch " +
         std::to_string(Micro);
}

/// The rank's sends and receives in the order it runs them.
std::vector<Event> rankEvents(const Program &P, const RankProgram &R) {
  std::vector<Event> Events;
  for (const ExecutionStep &St : executionOrder(P, R)) {
    const Instr *In = R.instrs()->Get(St.instr);
    if (In->op() == op::Send || In->op() == op::Recv)
      Events.push_back({In->op() == op::Send, In->ints()->Get(0),
                        In->ints()->Get(1), St.micro, St.instr,
                        taskText(St.segment, St.micro)});
  }
  return Events;
}

/// What a send's input or a receive's output holds: its dtype and shape.
std::string transferredText(const RankProgram &R, uint32_t Buf) {
  const Buffer *B = R.buffers()->Get(Buf);
  std::string Text = B->dtype() == dt::I32 ? "i32 [" : "f32 [";
  for (uint32_t D = 0; D < B->shape()->size(); ++D)
    Text += (D ? "," : "") + std::to_string(B->shape()->Get(D));
  return Text + "]";
}

/// A receive takes what its sends send: the same dtype and shape (else MPI
/// would cut the message short, or leave part of the buffer as it was).
std::string checkTransferShapes(const Program &P) {
  // (from, to, transfer) -> what the first send of it sends, and where.
  std::map<std::tuple<int64_t, int64_t, int64_t>,
           std::pair<std::string, uint32_t>>
      Sent;
  const uint32_t N = P.ranks()->size();
  for (uint32_t R = 0; R < N; ++R) {
    const RankProgram &RP = *P.ranks()->Get(R);
    if (RP.instrs())
      for (uint32_t I = 0; I < RP.instrs()->size(); ++I) {
        const Instr *In = RP.instrs()->Get(I);
        if (In->op() == op::Send)
          Sent.try_emplace({R, In->ints()->Get(0), In->ints()->Get(1)},
                           transferredText(RP, In->inputs()->Get(0)), I);
      }
  }
  for (uint32_t R = 0; R < N; ++R) {
    const RankProgram &RP = *P.ranks()->Get(R);
    if (RP.instrs())
      for (uint32_t I = 0; I < RP.instrs()->size(); ++I) {
        const Instr *In = RP.instrs()->Get(I);
        if (In->op() != op::Recv)
          continue;
        const int64_t From = In->ints()->Get(0), Transfer = In->ints()->Get(1);
        auto It = Sent.find({From, R, Transfer});
        const std::string Got = transferredText(RP, In->outputs()->Get(0));
        if (It != Sent.end() && It->second.first != Got)
          return "rank " + std::to_string(R) + ", instruction " +
                 std::to_string(I) + " (recv) receives transfer " +
                 std::to_string(Transfer) + " from rank " +
                 std::to_string(From) + " as " + Got + ", but rank " +
                 std::to_string(From) + "'s instruction " +
                 std::to_string(It->second.second) + " sends " +
                 It->second.first;
      }
  }
  return "";
}

} // namespace

std::string checkPipelineTransfers(const Program &P) {
  if (P.pipeline_stages() < 2 || !P.ranks())
    return "";
  const size_t N = P.ranks()->size();
  std::vector<std::vector<Event>> Events(N);
  bool Any = false;
  for (size_t R = 0; R < N; ++R) {
    Events[R] = rankEvents(P, *P.ranks()->Get(uint32_t(R)));
    Any |= !Events[R].empty();
  }
  if (!Any)
    return "";
  if (std::string Err = checkTransferShapes(P); !Err.empty())
    return Err;
  // Messages sent and not yet received: (from, to, transfer, micro).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, int> InFlight;
  std::vector<size_t> At(N, 0);
  for (bool Progress = true; Progress;) {
    Progress = false;
    for (size_t R = 0; R < N; ++R)
      for (; At[R] < Events[R].size(); ++At[R], Progress = true) {
        const Event &E = Events[R][At[R]];
        if (E.send) {
          ++InFlight[{int64_t(R), E.peer, E.transfer, E.micro}];
          continue;
        }
        auto It = InFlight.find({E.peer, int64_t(R), E.transfer, E.micro});
        if (It == InFlight.end() || It->second == 0)
          break;
        --It->second;
      }
  }
  std::string Stuck;
  int Named = 0;
  for (size_t R = 0; R < N; ++R) {
    if (At[R] == Events[R].size())
      continue;
    const Event &E = Events[R][At[R]];
    if (Named++ < 4)
      Stuck += std::string(Stuck.empty() ? "" : "; ") + "rank " +
               std::to_string(R) + " waits in " + E.where +
               " (instruction " + std::to_string(E.instr) +
               ") for transfer " + std::to_string(E.transfer) +
               " of micro-batch " + std::to_string(E.micro) + " from rank " +
               std::to_string(E.peer);
  }
  if (Named)
    return "the pipeline schedule deadlocks: " + Stuck +
           (Named > 4 ? " (and " + std::to_string(Named - 4) +
                            " more ranks)"
                      : "");
  for (const auto &[Key, Count] : InFlight)
    if (Count > 0)
      return "rank " + std::to_string(std::get<0>(Key)) + " sends transfer " +
             std::to_string(std::get<2>(Key)) + " of micro-batch " +
             std::to_string(std::get<3>(Key)) + " to rank " +
             std::to_string(std::get<1>(Key)) +
             ", which never receives it";
  return "";
}

} // namespace megac_rt
