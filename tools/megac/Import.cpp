//===- Import.cpp - megac import ------------------------------------------===//
//
// megac import: a megac model generated from a HuggingFace config.json
// (or the built-in tiny GPT-2).
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

#include "megac/Dialect/Megac/IR/MegacDialect.h"
#include "megac/Frontend/GPT2Importer.h"
#include "megac/InitAll.h"

#include "mlir/IR/Verifier.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
namespace cl = llvm::cl;

namespace megac::driver {

int runImport(int argc, char **argv) {
  static cl::OptionCategory category("megac import options");
  static cl::opt<std::string> config(
      "hf-config", cl::desc("HuggingFace GPT-2 config.json to import"),
      cl::value_desc("file"), cl::cat(category));
  static cl::opt<bool> tiny(
      "tiny",
      cl::desc("Import the built-in tiny GPT-2 (4 layers, hidden 128, "
               "4 heads, vocabulary 512, 128 positions)"),
      cl::cat(category));
  static cl::opt<bool> noTP(
      "no-tensor-parallel",
      cl::desc("Leave weights unannotated (everything replicated)"),
      cl::cat(category));
  static cl::opt<double> dropout(
      "dropout",
      cl::desc("Dropout rate after the embeddings, on the residual "
               "branches and on the attention probabilities (overrides "
               "embd_pdrop, resid_pdrop and attn_pdrop; training only)"),
      cl::init(-1.0), cl::cat(category));
  static cl::opt<int64_t> padVocab(
      "pad-vocab-to",
      cl::desc("Pad the vocabulary to a multiple of N (as Megatron's "
               "--make-vocab-size-divisible-by), so that tensor parallelism "
               "can split it: e.g. 128 turns GPT-2's 50257 into 50304. The "
               "padding rows are zero when HF weights are loaded, and the "
               "loss counts only the real vocabulary (default 1: none)"),
      cl::init(1), cl::value_desc("N"), cl::cat(category));
  static cl::opt<std::string> output("o", cl::desc("Output file (default: -)"),
                                     cl::value_desc("file"), cl::init("-"),
                                     cl::cat(category));
  if (!parseSubcommand(
          argc, argv,
          "megac import: generate a megac model from a HuggingFace config.\n\n"
          "  megac import --hf-config config.json -o model.mlir\n"))
    return 1;
  if (config.empty() == !tiny)
    return fail("give exactly one of --hf-config FILE or --tiny");
  if (!config.empty() && sameFileOrPath(config, output))
    return fail("-o " + output +
                " is the config being imported; the model would overwrite "
                "it");

  megac::GPT2Config parsed = megac::getTinyGPT2Config();
  if (!config.empty()) {
    // A config is a few KiB: anything else (a device such as /dev/zero,
    // which would be read forever, or a checkpoint named by mistake) is
    // refused before it is read.
    std::string error;
    auto buffer =
        readInput(config, uint64_t(16) << 20,
                  "a HuggingFace config.json, a few KiB of JSON", error);
    if (!buffer)
      return fail(error);
    auto result = megac::parseGPT2Config(buffer->getBuffer());
    if (!result)
      return fail(config + ": " + llvm::toString(result.takeError()));
    parsed = *result;
  }
  parsed.tensorParallel = !noTP;
  if (padVocab < 1)
    return fail("--pad-vocab-to must be positive, got " +
                std::to_string(padVocab.getValue()));
  parsed.padVocabTo = padVocab;
  // The padded tables must fit a plan's buffer as the config's do
  // (parseGPT2Config's 2^40 elements); a multiple past that would also
  // overflow the rounding.
  constexpr int64_t kMaxElements = int64_t(1) << 40;
  int64_t tableElements = 0;
  if (padVocab > kMaxElements ||
      llvm::MulOverflow(megac::paddedVocab(parsed), parsed.hidden,
                        tableElements) ||
      tableElements > kMaxElements)
    return fail("--pad-vocab-to " + std::to_string(padVocab.getValue()) +
                " makes the embedding table exceed 2^40 elements (vocabulary " +
                std::to_string(parsed.vocabSize) + " padded, x n_embd " +
                std::to_string(parsed.hidden) + ")");
  if (dropout.getNumOccurrences()) {
    if (!(dropout >= 0.0 && dropout < 1.0))
      return fail("--dropout must lie in [0, 1)");
    parsed.embeddingDropout = parsed.residualDropout = parsed.attentionDropout =
        dropout;
  }
  DialectRegistry registry;
  megac::registerAllDialects(registry);
  MLIRContext ctx(registry);
  OwningOpRef<ModuleOp> module = megac::buildGPT2Module(&ctx, parsed);
  if (failed(verify(*module)))
    return fail("internal error: the generated model does not verify");
  std::string error;
  auto out = openOutputFile(output, &error);
  if (!out)
    return fail(error);
  // (The name is the config's text: a line break in it would end the
  // comment and leave the rest of the name to be parsed as IR.)
  std::string commentName = parsed.name;
  for (char &c : commentName)
    if (megac::isControlChar(c))
      c = ' ';
  out->os() << "// " << commentName << ": " << parsed.numLayers
            << " layers, hidden " << parsed.hidden << ", " << parsed.numHeads
            << " heads, MLP width " << megac::mlpWidth(parsed)
            << ", vocabulary " << parsed.vocabSize
            << (megac::paddedVocab(parsed) != parsed.vocabSize
                    ? " (padded to " +
                          std::to_string(megac::paddedVocab(parsed)) + ")"
                    : std::string())
            << ", " << parsed.maxPositions
            << " positions. Generated by megac import.\n";
  module->print(out->os());
  return keepOutput(*out, output) ? 0 : 1;
}

} // namespace megac::driver
