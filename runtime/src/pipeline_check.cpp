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
  const Segment *segment; // null: the once-per-step part
};

std::string taskText(const Segment *S, int64_t Micro) {
  if (!S)
    return "the once-per-step part";
  return std::string(S->backward() ? "the backward" : "the forward") +
         " pass of stage " + std::to_string(S->stage()) + " on micro-batch " +
         std::to_string(Micro);
}

/// The rank's sends and receives in the order it runs them (only those: a
/// plan's steps are micro-batches x instructions).
std::vector<Event> rankEvents(const Program &P, const RankProgram &R) {
  std::vector<Event> Events;
  forEachExecutionStep(P, R, [&](const ExecutionStep &St) {
    const Instr *In = R.instrs()->Get(St.instr);
    // (Outside micro-batches the runtime tags messages as micro-batch 0.)
    if (In->op() == op::Send || In->op() == op::Recv)
      Events.push_back({In->op() == op::Send, In->ints()->Get(0),
                        In->ints()->Get(1), std::max<int64_t>(St.micro, 0),
                        St.instr, St.segment});
  });
  return Events;
}

/// The buffer a send sends or a receive fills.
const Buffer &transferred(const RankProgram &R, const Instr &In) {
  return *R.buffers()->Get(In.op() == op::Send ? In.inputs()->Get(0)
                                               : In.outputs()->Get(0));
}

bool sameTransferred(const Buffer &A, const Buffer &B) {
  return A.dtype() == B.dtype() &&
         std::equal(A.shape()->begin(), A.shape()->end(), B.shape()->begin(),
                    B.shape()->end());
}

/// A buffer's dtype and shape, as "f32 [2,3]".
std::string transferredText(const Buffer &B) {
  std::string Text = B.dtype() == dt::I32 ? "i32 [" : "f32 [";
  for (uint32_t D = 0; D < B.shape()->size(); ++D)
    Text += (D ? "," : "") + std::to_string(B.shape()->Get(D));
  return Text + "]";
}

/// The sends of one (from, to, transfer, micro-batch) not yet received, in
/// the order they went out: MPI matches a tag's messages in that order.
struct Queue {
  std::vector<uint32_t> sendInstrs;
  size_t received = 0;
};

/// Why receive \p E of rank \p R cannot take the send it pairs with, rank
/// E.peer's instruction \p SendInstr ("" if it can).
std::string checkPair(const Program &P, size_t R, const Event &E,
                      uint32_t SendInstr) {
  const RankProgram &To = *P.ranks()->Get(uint32_t(R));
  const RankProgram &From = *P.ranks()->Get(uint32_t(E.peer));
  const Instr &Recv = *To.instrs()->Get(E.instr);
  const Instr &Send = *From.instrs()->Get(SendInstr);
  const std::string Pair =
      "rank " + std::to_string(R) + ", instruction " + std::to_string(E.instr) +
      " (recv) receives transfer " + std::to_string(E.transfer) +
      " of micro-batch " + std::to_string(E.micro) + " from rank " +
      std::to_string(E.peer);
  const std::string Sender = "rank " + std::to_string(E.peer) +
                             "'s instruction " + std::to_string(SendInstr);
  // A receive takes what its send sends: the same dtype and shape (else
  // MPI cuts the message short, or leaves part of the buffer as it was).
  const Buffer &Got = transferred(To, Recv);
  const Buffer &Sent = transferred(From, Send);
  if (!sameTransferred(Got, Sent))
    return Pair + " as " + transferredText(Got) + ", but " + Sender +
           " sends " + transferredText(Sent);
  // Training steps skip generation-only instructions: a message with one
  // end skipped leaves the other end waiting.
  if (Recv.generation_only() != Send.generation_only())
    return Pair + ", but only " +
           (Send.generation_only() ? Sender : std::string("the recv")) +
           " is generation-only (training steps skip it; the other end would "
           "wait)";
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
  // Messages sent and not yet received: (from, to, transfer, micro).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, Queue> InFlight;
  std::vector<size_t> At(N, 0);
  for (bool Progress = true; Progress;) {
    Progress = false;
    for (size_t R = 0; R < N; ++R)
      for (; At[R] < Events[R].size(); ++At[R], Progress = true) {
        const Event &E = Events[R][At[R]];
        if (E.send) {
          InFlight[{int64_t(R), E.peer, E.transfer, E.micro}]
              .sendInstrs.push_back(E.instr);
          continue;
        }
        auto It = InFlight.find({E.peer, int64_t(R), E.transfer, E.micro});
        if (It == InFlight.end())
          break;
        Queue &Q = It->second;
        const uint32_t SendInstr = Q.sendInstrs[Q.received++];
        // (Only messages in flight are held.)
        if (Q.received == Q.sendInstrs.size())
          InFlight.erase(It);
        if (std::string Err = checkPair(P, R, E, SendInstr); !Err.empty())
          return Err;
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
               std::to_string(R) + " waits in " + taskText(E.segment, E.micro) +
               " (instruction " + std::to_string(E.instr) + ") for transfer " +
               std::to_string(E.transfer) + " of micro-batch " +
               std::to_string(E.micro) + " from rank " + std::to_string(E.peer);
  }
  if (Named)
    return "the pipeline schedule deadlocks: " + Stuck +
           (Named > 4 ? " (and " + std::to_string(Named - 4) +
                            " more ranks)"
                      : "");
  if (!InFlight.empty()) {
    const auto &Key = InFlight.begin()->first;
    return "rank " + std::to_string(std::get<0>(Key)) + " sends transfer " +
           std::to_string(std::get<2>(Key)) + " of micro-batch " +
           std::to_string(std::get<3>(Key)) + " to rank " +
           std::to_string(std::get<1>(Key)) + ", which never receives it";
  }
  return "";
}

} // namespace megac_rt
