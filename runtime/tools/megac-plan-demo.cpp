//===- megac-plan-demo.cpp - Write GPT-2 demo plans without the compiler ---===//
//
// Produces a Megatron-style tensor-parallel GPT-2 plan for any tp degree
// through the runtime's own plan builder. It exists so the runtime can be
// tested end to end (tp=1 vs tp=N, and against utils/gpt2_reference.py)
// independently of the MLIR compiler.
//
//===----------------------------------------------------------------------===//

#include "plan_builder.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <tuple>

using namespace megac_rt;

int main(int Argc, char **Argv) {
  builder::Gpt2DemoOptions O;
  builder::TrainDemoOptions T;
  std::string Out;
  bool NoLoss = false, Print = false, Train = false;
  uint32_t CollectiveTest = 0, DropoutTest = 0;
  double DropoutRate = 0.25;
  CLI::App App("Writes a tensor-parallel GPT-2 plan for megac-run tests, "
               "or (--train) a small hand-built training plan.",
               "megac-plan-demo");
  App.add_option("-o,--output", Out, "Plan file to write")->required();
  App.add_option("--tp", O.tp, "Tensor-parallel degree (= world size)");
  App.add_option("--n-layer", O.nLayer, "Transformer blocks");
  App.add_option("--n-embd", O.nEmbd, "Hidden size");
  App.add_option("--n-head", O.nHead, "Attention heads");
  App.add_option("--vocab", O.vocab, "Vocabulary size");
  App.add_option("--n-positions", O.nPositions, "Position table rows");
  App.add_option("--batch", O.batch, "Batch size");
  App.add_option("--seq", O.seq, "Sequence length");
  App.add_option("--seed", O.seed, "Default seed stored in the plan");
  App.add_option("--eps", O.eps, "Layer norm epsilon");
  App.add_flag("--no-loss", NoLoss, "Omit labels and the loss output");
  App.add_flag("--print", Print, "Also print the plan as text");
  App.add_flag("--train", Train,
               "Write the training plan (embedding, layer norm, GeLU MLP, "
               "tied head, backward, clipping, AdamW) instead of GPT-2; uses "
               "--vocab, --n-embd, --n-positions, --batch (global), --seq, "
               "--seed, --eps and the options below");
  App.add_option("--dp", T.dp, "Training plan: data-parallel degree");
  App.add_option("--n-ff", T.nFf, "Training plan: MLP hidden size");
  App.add_option("--lr", T.maxLr, "Training plan: peak learning rate");
  App.add_option("--min-lr", T.minLr, "Training plan: final learning rate");
  App.add_option("--warmup", T.warmup, "Training plan: warm-up steps");
  App.add_option("--total-steps", T.totalSteps,
                 "Training plan: step at which the cosine decay ends");
  App.add_option("--clip", T.clip,
                 "Training plan: max gradient norm (0: no clipping)");
  App.add_option("--weight-decay", T.weightDecay,
                 "Training plan: AdamW weight decay");
  App.add_flag("--zero", T.zero,
               "Training plan: ZeRO stage 1 over dp (reduce-scattered "
               "gradients, each rank updates its dim-0 slice of every "
               "parameter, all-gather + assign)");
  App.add_option("--collective-test", CollectiveTest,
                 "Write instead a forward plan for N ranks that checks "
                 "reduce_scatter / all_gather / assign (see "
                 "buildCollectiveTest in plan_builder.h)");
  App.add_option("--dropout-test", DropoutTest,
                 "Write instead a forward plan for N ranks (N dividing 8) "
                 "that applies dropout to each rank's block of a tensor "
                 "and gathers the blocks (see buildDropoutTest in "
                 "plan_builder.h)");
  App.add_option("--dropout-rate", DropoutRate,
                 "Dropout test plan: the rate (default 0.25)");
  CLI11_PARSE(App, Argc, Argv);
  // Sizes are positive (a zero head count divided by zero; a zero width
  // wrote a plan of zeros), layers not negative, the optimizer's numbers
  // in range (as megac compile's).
  for (auto [Name, Value, Least] :
       {std::tuple<const char *, double, double>{"--n-layer", O.nLayer, 0},
        {"--n-embd", O.nEmbd, 1},
        {"--n-head", O.nHead, 1},
        {"--vocab", O.vocab, 1},
        {"--n-positions", O.nPositions, 1},
        {"--batch", O.batch, 1},
        {"--seq", O.seq, 1},
        {"--n-ff", T.nFf, 1},
        {"--clip", T.clip, 0},
        {"--weight-decay", T.weightDecay, 0},
        {"--min-lr", T.minLr, 0},
        {"--warmup", T.warmup, 0}})
    if (!(Value >= Least)) {
      std::fprintf(stderr, "megac-plan-demo: error: %s must be at least %g\n",
                   Name, Least);
      return 1;
    }
  if (!(T.maxLr > 0) || !(T.totalSteps > 0)) {
    std::fprintf(stderr, "megac-plan-demo: error: --lr and --total-steps "
                         "must be positive\n");
    return 1;
  }
  if (DropoutTest) {
    bool Divides = true;
    for (int64_t D : builder::dropoutTestShape())
      Divides &= D % int64_t(DropoutTest) == 0;
    if (!Divides || !(DropoutRate >= 0 && DropoutRate < 1)) {
      std::fprintf(stderr, "megac-plan-demo: error: --dropout-test needs N "
                           "dividing 8 and 0 <= --dropout-rate < 1\n");
      return 1;
    }
  }
  O.loss = !NoLoss;
  if (Train) {
    T.vocab = App.count("--vocab") ? O.vocab : T.vocab;
    T.nEmbd = App.count("--n-embd") ? O.nEmbd : T.nEmbd;
    T.batch = App.count("--batch") ? O.batch : T.batch;
    T.seq = App.count("--seq") ? O.seq : T.seq;
    T.nPositions = App.count("--n-positions") ? O.nPositions : T.seq;
    T.seed = O.seed;
    T.eps = O.eps;
    const int64_t Dp = T.dp ? int64_t(T.dp) : 1;
    if (T.zero && (T.vocab % Dp || T.nPositions % Dp || T.nEmbd % Dp ||
                   T.nFf % Dp)) {
      std::fprintf(stderr, "megac-plan-demo: error: --zero needs dp to "
                           "divide vocab, n-positions, n-embd and n-ff\n");
      return 1;
    }
    if (T.dp == 0 || T.batch % T.dp || T.seq > T.nPositions || T.vocab <= 0 ||
        T.nEmbd <= 0 || T.nFf <= 0) {
      std::fprintf(stderr, "megac-plan-demo: error: dp must divide batch; "
                           "seq must not exceed n-positions; sizes must be "
                           "positive\n");
      return 1;
    }
  }

  if (!Train && !CollectiveTest && !DropoutTest && (O.tp == 0 || O.vocab % O.tp || O.nEmbd % O.tp || O.nHead % O.tp ||
      O.nEmbd % O.nHead || O.seq > O.nPositions)) {
    std::fprintf(stderr, "megac-plan-demo: error: tp must divide vocab, "
                         "n-embd and n-head; n-head must divide n-embd; "
                         "seq must not exceed n-positions\n");
    return 1;
  }
  std::vector<uint8_t> Bytes = builder::buildPlanBytes(
      CollectiveTest ? builder::buildCollectiveTest(CollectiveTest, O.seed)
      : DropoutTest  ? builder::buildDropoutTest(DropoutTest, O.seed,
                                                 DropoutRate)
      : Train        ? builder::buildTrainDemo(T)
                     : builder::buildGpt2Demo(O),
      "megac-plan-demo 0.1");
  LoadedPlan Plan;
  std::string Err = verifyPlanBytes(Bytes, Plan);
  if (!Err.empty()) {
    std::fprintf(stderr, "megac-plan-demo: error: generated plan does not "
                         "verify: %s\n", Err.c_str());
    return 1;
  }
  FILE *F = std::fopen(Out.c_str(), "wb");
  if (!F || std::fwrite(Bytes.data(), 1, Bytes.size(), F) != Bytes.size() ||
      std::fclose(F) != 0) {
    std::fprintf(stderr, "megac-plan-demo: error: cannot write %s\n",
                 Out.c_str());
    return 1;
  }
  if (Print)
    std::fputs(dumpPlanText(Plan).c_str(), stdout);
  return 0;
}
