//===- Inspect.cpp - megac inspect ----------------------------------------===//
//
// megac inspect: a plan printed as text or JSON, or its schedule as a
// Chrome trace.
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

#include "megac_rt/plan_file.h"
#include "megac_rt/trace.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include <algorithm>

using namespace mlir;
namespace cl = llvm::cl;

namespace megac::driver {

int runInspect(int argc, char **argv) {
  static cl::OptionCategory category("megac inspect options");
  static cl::opt<std::string> input(cl::Positional, cl::Required,
                                    cl::desc("<model.mgc>"), cl::cat(category));
  static cl::opt<bool> json("json", cl::desc("Print JSON instead of text"),
                            cl::cat(category));
  static cl::opt<int> rank("rank", cl::desc("Print only this rank"),
                           cl::init(-1), cl::cat(category));
  static cl::opt<std::string> trace(
      "trace",
      cl::desc("Write the schedule every rank is expected to follow (a cost "
               "model: 20 GFLOP/s, 5 GB/s memory, 2 GB/s links per rank; "
               "collectives wait for their whole group) as Chrome "
               "trace-event JSON, for Perfetto, instead of printing"),
      cl::value_desc("file.json"), cl::cat(category));
  if (!parseSubcommand(argc, argv,
                       "megac inspect: print a plan (verified first) as text "
                       "or JSON, or write "
                       "its expected schedule as a trace.\n"))
    return 1;
  if (!trace.empty() && (json || rank.getNumOccurrences()))
    return fail("--trace writes every rank's schedule as trace JSON; "
                "--json and --rank choose what is printed instead");
  if (!trace.empty() && sameFileOrPath(input, trace))
    return fail("--trace " + trace +
                " is the plan being inspected; the trace would overwrite it");
  megac_rt::LoadedPlan plan;
  std::string message = megac_rt::loadPlanFile(input, plan);
  if (!message.empty())
    return fail(message);
  if (!trace.empty()) {
    std::vector<std::vector<megac_rt::TraceSpan>> spans;
    std::string problem =
        megac_rt::estimateSchedule(*plan.program, megac_rt::CostModel(), spans);
    if (!problem.empty())
      return fail(input + ": " + problem);
    std::vector<std::string> perRank;
    double end = 0;
    for (uint32_t r = 0; r < spans.size(); ++r) {
      perRank.push_back(megac_rt::traceEventsJson(*plan.program, r, spans[r]));
      if (!spans[r].empty())
        end = std::max(end, spans[r].back().startUs + spans[r].back().durUs);
    }
    std::string error;
    auto out = mlir::openOutputFile(trace, &error);
    if (!out)
      return fail(error);
    out->os() << megac_rt::traceFileJson(perRank);
    if (!keepOutput(*out, trace))
      return 1;
    llvm::errs() << llvm::formatv("megac: wrote the expected schedule of {0} "
                                  "ranks to {1}: one step takes {2:F3} ms\n",
                                  spans.size(), trace, end / 1e3);
    return 0;
  }
  if (rank.getNumOccurrences() &&
      (rank < 0 || static_cast<uint32_t>(rank) >= plan.program->world_size()))
    return fail(llvm::formatv("--rank must be a rank of the plan (0 to {0}), "
                              "got {1}",
                              plan.program->world_size() - 1, rank));
  // Written a rank at a time. (A write error shows when main flushes
  // standard output.)
  auto toStdout = [](std::string_view text) {
    llvm::outs() << llvm::StringRef(text.data(), text.size());
    return true;
  };
  if (!(json ? megac_rt::writePlanJson(plan, rank, toStdout)
             : megac_rt::writePlanText(plan, rank, toStdout)))
    return fail(input + ": the plan's dump was cut short (out of memory?)");
  return 0;
}

} // namespace megac::driver
