//===- trace.cpp - Schedules as Chrome trace-event JSON -------------------===//

#include "megac_rt/trace.h"
#include "megac_rt/plan_file.h"
#include "plan_enums.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <tuple>

namespace megac_rt {

using namespace megac::plan;

namespace {

bool communicatesOp(OpCode Op) {
  return Op == op::AllReduce || Op == op::AllGather || Op == op::ReduceScatter;
}

bool transferOp(OpCode Op) { return Op == op::Send || Op == op::Recv; }

} // namespace

void forEachExecutionStep(
    const Program &P, const RankProgram &R,
    const std::function<void(const ExecutionStep &)> &Visit) {
  const uint32_t N = R.instrs() ? R.instrs()->size() : 0;
  const int32_t AccEnd = R.accumulate_end();
  uint32_t Rest = 0;
  int64_t RestMicro = -1;
  if (R.segments() && R.segments()->size() && R.schedule()) {
    for (const Task *T : *R.schedule()) {
      const Segment *S = R.segments()->Get(T->segment());
      for (uint32_t I = S->begin(); I < S->end(); ++I)
        Visit({I, int64_t(T->micro_batch()), S});
    }
    Rest = uint32_t(std::max(AccEnd, 0));
    RestMicro = 0;
  } else if (P.micro_batches() > 1 && AccEnd > 0) {
    for (int64_t K = 0; K < P.micro_batches(); ++K)
      for (uint32_t I = 0; I < uint32_t(AccEnd); ++I)
        Visit({I, K, nullptr});
    Rest = uint32_t(AccEnd);
    RestMicro = 0;
  }
  for (uint32_t I = Rest; I < N; ++I)
    Visit({I, RestMicro, nullptr});
}

std::vector<ExecutionStep> executionOrder(const Program &P,
                                          const RankProgram &R) {
  std::vector<ExecutionStep> Order;
  forEachExecutionStep(P, R,
                       [&](const ExecutionStep &St) { Order.push_back(St); });
  return Order;
}

namespace {

int64_t elementsOf(const RankProgram &R, uint32_t B) {
  int64_t N = 1;
  for (int64_t D : *R.buffers()->Get(B)->shape())
    N *= D;
  return N;
}

const flatbuffers::Vector<int64_t> &shapeOf(const RankProgram &R, uint32_t B) {
  return *R.buffers()->Get(B)->shape();
}

} // namespace

double flopsOf(const RankProgram &R, const Instr &In) {
  if (In.op() == op::Send || In.op() == op::Recv)
    return 0;
  const uint32_t X = In.inputs() && In.inputs()->size() ? In.inputs()->Get(0) : 0;
  const uint32_t Y = In.outputs()->Get(0);
  const double Out = double(elementsOf(R, Y));
  switch (In.op()) {
  case op::Linear:
  case op::LinearBias:
  case op::LinearGeluGrad: {
    const auto &S = shapeOf(R, X);
    return 2.0 * Out * double(S[S.size() - 1]);
  }
  case op::LinearWeightGrad:
    return 2.0 * double(elementsOf(R, X)) *
           double(shapeOf(R, In.inputs()->Get(1))[shapeOf(R, In.inputs()->Get(1)).size() - 1]);
  case op::MatMul: {
    const auto &S = shapeOf(R, X);
    return 2.0 * Out * double(S[S.size() - 1]);
  }
  case op::Attention:
  case op::AttentionGrad: {
    const auto &S = shapeOf(R, X); // [B, S, Hl]
    const double F = 4.0 * double(S[0]) * double(S[1]) * double(S[1]) * double(S[2]);
    // An attention gradient step: 2 F; dk and dv together (which = 3): 4 F.
    return In.op() == op::Attention ? F : 2.0 * F * In.outputs()->size();
  }
  default:
    return 5.0 * Out;
  }
}

double bytesOf(const RankProgram &R, const Instr &In) {
  double Bytes = 0;
  if (In.inputs())
    for (uint32_t B : *In.inputs())
      Bytes += 4.0 * double(elementsOf(R, B));
  for (uint32_t B : *In.outputs())
    Bytes += 4.0 * double(elementsOf(R, B));
  return Bytes;
}

namespace {

/// Ring algorithms: an all-reduce moves 2 (g-1)/g of the data per rank,
/// an all-gather or reduce-scatter (g-1)/g of the whole.
double collectiveUs(const RankProgram &R, const Instr &In, int64_t G,
                    const CostModel &M) {
  double Data = 0;
  for (uint32_t B : *In.inputs())
    Data += 4.0 * double(elementsOf(R, B));
  if (In.op() == op::AllGather)
    Data *= double(G);
  const double Factor = In.op() == op::AllReduce ? 2.0 : 1.0;
  return M.collectiveLatencyUs +
         Factor * double(G - 1) / double(G) * Data / M.linkBytesPerUs;
}

} // namespace

std::string traceEventsJson(const Program &P, uint32_t Rank,
                            const std::vector<TraceSpan> &Spans) {
  const RankProgram &R = *P.ranks()->Get(Rank);
  std::string Name = "rank " + std::to_string(Rank);
  std::string Coords;
  for (size_t A = 0; P.axes() && A < P.axes()->size(); ++A)
    Coords += (Coords.empty() ? "" : ", ") + P.axes()->Get(A)->name()->str() +
              "=" + std::to_string(R.coords()->Get(A));
  if (!Coords.empty())
    Name += " (" + Coords + ")";
  // Each event is written as it is made: a document of all of them would
  // take a kilobyte or two per event (a long --trace ran out of memory).
  std::string Text;
  auto Append = [&Text](const nlohmann::json &Event) {
    // (Locations are the user's file names, not always UTF-8.)
    Text += (Text.empty() ? "" : ",");
    Text +=
        Event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  Append({{"name", "process_name"},
          {"ph", "M"},
          {"pid", Rank},
          {"args", {{"name", Name}}}});
  for (const TraceSpan &S : Spans) {
    const Instr &In = *R.instrs()->Get(S.instr);
    nlohmann::json Args = {{"instr", S.instr}};
    if (In.loc())
      Args["loc"] = In.loc()->str();
    if (S.step >= 0)
      Args["step"] = S.step;
    if (S.micro >= 0)
      Args["micro_batch"] = S.micro;
    const bool Comm = communicatesOp(In.op()) || transferOp(In.op());
    Append({{"name", opcodeName(In.op())},
            {"cat", communicatesOp(In.op()) ? "collective"
                    : transferOp(In.op())   ? "transfer"
                                            : "compute"},
            {"ph", "X"},
            {"pid", Rank},
            {"tid", Comm ? 1 : 0},
            {"ts", S.startUs},
            {"dur", S.durUs},
            {"args", Args}});
  }
  return Text;
}

std::string traceFileJson(const std::vector<std::string> &PerRank) {
  std::string Out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  bool First = true;
  for (const std::string &Events : PerRank) {
    if (Events.empty())
      continue;
    Out += (First ? "\n" : ",\n") + Events;
    First = false;
  }
  return Out + "\n]}\n";
}

std::string estimateSchedule(const Program &P, const CostModel &M,
                             std::vector<std::vector<TraceSpan>> &Out) {
  const uint32_t N = P.ranks()->size();
  const size_t NA = P.axes() ? P.axes()->size() : 0;
  const bool Training = P.train() != nullptr;
  // Group of each rank on each axis.
  std::vector<std::vector<uint32_t>> GroupOf(NA, std::vector<uint32_t>(N, 0));
  for (size_t A = 0; A < NA; ++A)
    for (uint32_t G = 0; G < P.axes()->Get(A)->groups()->size(); ++G)
      for (uint32_t R : *P.axes()->Get(A)->groups()->Get(G)->ranks())
        GroupOf[A][R] = G;
  Out.assign(N, {});
  std::vector<std::vector<ExecutionStep>> Order(N);
  for (uint32_t R = 0; R < N; ++R)
    Order[R] = executionOrder(P, *P.ranks()->Get(R));
  std::vector<uint32_t> Ptr(N, 0);
  std::vector<double> Clock(N, 0);
  std::vector<std::vector<uint32_t>> Seq(N, std::vector<uint32_t>(NA, 0));
  // Arrivals at a collective: (axis, group, sequence number) -> ranks.
  std::map<std::tuple<size_t, uint32_t, uint32_t>, std::vector<uint32_t>> Waiting;
  // Pipeline messages sent: (from, to, transfer, micro-batch) -> arrival.
  std::map<std::tuple<uint32_t, int64_t, int64_t, int64_t>, double> Arrives;
  for (;;) {
    bool Progress = false, Done = true;
    for (uint32_t R = 0; R < N; ++R) {
      const RankProgram &RP = *P.ranks()->Get(R);
      while (Ptr[R] < Order[R].size()) {
        const ExecutionStep St = Order[R][Ptr[R]];
        const Instr &In = *RP.instrs()->Get(St.instr);
        if (Training && In.generation_only()) {
          ++Ptr[R];
          continue;
        }
        if (transferOp(In.op())) {
          // A send copies and goes on; its message arrives after the
          // link's latency and bandwidth. A receive waits for it.
          const int64_t Peer = In.ints()->Get(0), Id = In.ints()->Get(1);
          const double Bytes = bytesOf(RP, In);
          if (In.op() == op::Send) {
            const double Us = Bytes / M.bytesPerUs;
            Out[R].push_back({St.instr, Clock[R], Us, -1, St.micro});
            Clock[R] += Us;
            Arrives[{R, Peer, Id, St.micro}] =
                Clock[R] + M.collectiveLatencyUs + Bytes / M.linkBytesPerUs;
          } else {
            auto It = Arrives.find({uint32_t(Peer), int64_t(R), Id, St.micro});
            if (It == Arrives.end())
              break; // the peer has not sent it yet
            const double Start = std::max(Clock[R], It->second);
            const double Us = Bytes / M.bytesPerUs;
            Out[R].push_back({St.instr, Start, Us, -1, St.micro});
            Clock[R] = Start + Us;
            Arrives.erase(It);
          }
          ++Ptr[R];
          Progress = true;
          continue;
        }
        if (!communicatesOp(In.op()) || In.axis() < 0) {
          const double Us = std::max(flopsOf(RP, In) / M.flopsPerUs,
                                     bytesOf(RP, In) / M.bytesPerUs);
          Out[R].push_back({St.instr, Clock[R], Us, -1, St.micro});
          Clock[R] += Us;
          ++Ptr[R];
          Progress = true;
          continue;
        }
        const size_t A = size_t(In.axis());
        auto Key = std::make_tuple(A, GroupOf[A][R], Seq[R][A]);
        std::vector<uint32_t> &Here = Waiting[Key];
        if (std::find(Here.begin(), Here.end(), R) == Here.end()) {
          Here.push_back(R);
          Progress = true;
        }
        const auto *Members =
            P.axes()->Get(A)->groups()->Get(GroupOf[A][R])->ranks();
        if (Here.size() < Members->size())
          break; // wait for the rest of the group
        double Start = 0;
        for (uint32_t Q : Here)
          Start = std::max(Start, Clock[Q]);
        const double Us = collectiveUs(RP, In, int64_t(Members->size()), M);
        for (uint32_t Q : Here) {
          Out[Q].push_back({Order[Q][Ptr[Q]].instr, Start, Us, -1,
                            Order[Q][Ptr[Q]].micro});
          Clock[Q] = Start + Us;
          ++Ptr[Q];
          ++Seq[Q][A];
        }
        Waiting.erase(Key);
      }
      Done &= Ptr[R] >= Order[R].size();
    }
    if (Done)
      return "";
    if (!Progress) {
      // Nobody can move: name who waits where.
      std::string Msg = "the schedule cannot complete:";
      for (uint32_t R = 0; R < N; ++R) {
        if (Ptr[R] >= Order[R].size())
          continue;
        const uint32_t I = Order[R][Ptr[R]].instr;
        const Instr &In = *P.ranks()->Get(R)->instrs()->Get(I);
        if (In.op() == op::Recv)
          Msg += " rank " + std::to_string(R) + " waits in recv (instruction " +
                 std::to_string(I) + ") for transfer " +
                 std::to_string(In.ints()->Get(1)) + " from rank " +
                 std::to_string(In.ints()->Get(0)) + ";";
      }
      for (const auto &[Key, Ranks] : Waiting) {
        const size_t A = std::get<0>(Key);
        const uint32_t R = Ranks.front();
        const Instr &In =
            *P.ranks()->Get(R)->instrs()->Get(Order[R][Ptr[R]].instr);
        Msg += " ranks";
        for (uint32_t Q : Ranks)
          Msg += " " + std::to_string(Q);
        Msg += std::string(" wait in ") + opcodeName(In.op()) + " over " +
               P.axes()->Get(A)->name()->str() + " (instruction " +
               std::to_string(Order[R][Ptr[R]].instr) +
               ") for the rest of their group;";
      }
      Msg.pop_back();
      return Msg;
    }
  }
}

} // namespace megac_rt
