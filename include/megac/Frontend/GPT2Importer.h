//===- GPT2Importer.h - HuggingFace GPT-2 config to megac IR ----*- C++ -*-===//
//
// `megac import --hf-config config.json` turns a GPT-2-family config into a
// megac model: parameters as annotated function arguments (init spec, HF
// tensor name, Megatron tensor-parallel sharding of the weights) and the
// forward pass returning logits and the mean cross-entropy loss.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_FRONTEND_GPT2IMPORTER_H
#define MEGAC_FRONTEND_GPT2IMPORTER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"
#include <cstdint>
#include <string>

namespace megac {

struct GPT2Config {
  std::string name = "gpt2";
  int64_t numLayers = 0;
  int64_t hidden = 0;
  int64_t numHeads = 0;
  int64_t vocabSize = 0;
  int64_t maxPositions = 0;
  /// The MLP's inner width (n_inner); 0 means HF's default, 4 x hidden.
  int64_t inner = 0;
  /// Pad the vocabulary to a multiple of this (1: none), as Megatron's
  /// --make-vocab-size-divisible-by, so that tensor parallelism can split
  /// it: the embedding tables get zero rows that HF checkpoints lack, and
  /// the loss counts only the real vocabulary.
  int64_t padVocabTo = 1;
  double layerNormEpsilon = 1e-5;
  double initStd = 0.02;
  bool tieEmbeddings = true;
  /// Annotate weights with Megatron tensor-parallel shardings on axis "tp".
  bool tensorParallel = true;
  /// Dropout after the embeddings (embd_pdrop), on the two residual
  /// branches of each block (resid_pdrop) and on the attention
  /// probabilities (attn_pdrop, inside the fused attention op); 0 emits
  /// none.
  double embeddingDropout = 0.0;
  double residualDropout = 0.0;
  double attentionDropout = 0.0;
};

/// Parses a HuggingFace GPT-2 config (also accepts the generic names
/// num_hidden_layers, hidden_size, num_attention_heads,
/// max_position_embeddings, intermediate_size). Errors name the offending
/// key. Keys that would change the model into one megac does not build
/// (another activation_function than GeLU's tanh form, unscaled or
/// layer-scaled attention scores, cross-attention) are errors, not ignored.
llvm::Expected<GPT2Config> parseGPT2Config(llvm::StringRef json);

/// The small model the README's demo and the tests use: 4 layers, hidden
/// 128, 4 heads, vocabulary 512, 128 positions.
GPT2Config getTinyGPT2Config();

/// The MLP's inner width: n_inner, or 4 x hidden where the config leaves it
/// out (or null), as HF's GPT-2 does.
inline int64_t mlpWidth(const GPT2Config &config) {
  return config.inner > 0 ? config.inner : 4 * config.hidden;
}

/// The embedding tables' rows: the vocabulary rounded up to a multiple of
/// padVocabTo.
inline int64_t paddedVocab(const GPT2Config &config) {
  const int64_t m = config.padVocabTo > 1 ? config.padVocabTo : 1;
  return (config.vocabSize + m - 1) / m * m;
}

/// Builds the model; batch and sequence dimensions are dynamic.
mlir::OwningOpRef<mlir::ModuleOp> buildGPT2Module(mlir::MLIRContext *ctx,
                                                  const GPT2Config &config);

} // namespace megac

#endif // MEGAC_FRONTEND_GPT2IMPORTER_H
