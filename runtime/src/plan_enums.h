//===- plan_enums.h - Enumerator constants independent of flatc flags -*- C++ -*-===//
//
// flatc spells enumerators op::Linear with --scoped-enums and
// OpCode_Linear without it, and the build has used both. The runtime names
// them through these constants (values fixed by plan.fbs) so it compiles
// either way.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_PLAN_ENUMS_H
#define MEGAC_RT_PLAN_ENUMS_H

#include "plan_generated.h"

namespace megac_rt {

namespace op {
using megac::plan::OpCode;
constexpr OpCode Embedding = OpCode(0);
constexpr OpCode PositionEmbedding = OpCode(1);
constexpr OpCode Linear = OpCode(2);
constexpr OpCode MatMul = OpCode(3);
constexpr OpCode Add = OpCode(4);
constexpr OpCode Mul = OpCode(5);
constexpr OpCode Gelu = OpCode(6);
constexpr OpCode LayerNorm = OpCode(7);
constexpr OpCode Attention = OpCode(8);
constexpr OpCode Softmax = OpCode(9);
constexpr OpCode Reshape = OpCode(10);
constexpr OpCode Transpose = OpCode(11);
constexpr OpCode CrossEntropy = OpCode(12);
constexpr OpCode AllReduce = OpCode(13);
constexpr OpCode AllGather = OpCode(14);
constexpr OpCode SliceShard = OpCode(15);
// Backward and optimizer ops (format version 2).
constexpr OpCode LinearWeightGrad = OpCode(16);
constexpr OpCode GeluGrad = OpCode(17);
constexpr OpCode LayerNormGrad = OpCode(18);
constexpr OpCode Normalize = OpCode(19);
constexpr OpCode AttentionGrad = OpCode(20);
constexpr OpCode SoftmaxGrad = OpCode(21);
constexpr OpCode EmbeddingGrad = OpCode(22);
constexpr OpCode PositionEmbeddingGrad = OpCode(23);
constexpr OpCode CrossEntropyGrad = OpCode(24);
constexpr OpCode SumLeading = OpCode(25);
constexpr OpCode SumSquares = OpCode(26);
constexpr OpCode ClipCoefficient = OpCode(27);
constexpr OpCode Fill = OpCode(28);
constexpr OpCode AdamW = OpCode(29);
// ZeRO (format version 3).
constexpr OpCode ReduceScatter = OpCode(30);
constexpr OpCode Assign = OpCode(31);
// Dropout (format version 4).
constexpr OpCode Dropout = OpCode(32);
// Vocabulary-parallel cross-entropy (format version 5).
constexpr OpCode CrossEntropyStats = OpCode(33);
constexpr OpCode CrossEntropyFromStats = OpCode(34);
// Gradient accumulation (format version 5).
constexpr OpCode Accumulate = OpCode(35);
// Mixed precision (format version 5).
constexpr OpCode RoundBf16 = OpCode(36);
// Pipeline parallelism (format version 6).
constexpr OpCode Send = OpCode(37);
constexpr OpCode Recv = OpCode(38);
// GPU kernels (format version 6).
constexpr OpCode Fused = OpCode(39);
constexpr OpCode LinearBias = OpCode(40);
// Fused LayerNorm gain gradient (format version 9).
constexpr OpCode LayerNormGainGrad = OpCode(41);
// A product with GeLU's gradient as its epilogue (format version 10).
constexpr OpCode LinearGeluGrad = OpCode(42);
// Per-row outputs under gradient accumulation (format version 16).
constexpr OpCode StackMicroBatches = OpCode(43);
/// The highest opcode this runtime knows.
constexpr OpCode LastOpCode = StackMicroBatches;
} // namespace op

namespace dt {
constexpr megac::plan::DType F32 = megac::plan::DType(0);
constexpr megac::plan::DType I32 = megac::plan::DType(1);
} // namespace dt

namespace ik {
constexpr megac::plan::InitKind Zeros = megac::plan::InitKind(0);
constexpr megac::plan::InitKind Ones = megac::plan::InitKind(1);
constexpr megac::plan::InitKind Normal = megac::plan::InitKind(2);
} // namespace ik

/// The gradient steps an attention_grad instruction takes, as "which"
/// numbers them (0 q, 1 k, 2 v): First, First + 1, ..., one per output in
/// that order. which = 0, 1 or 2 is that step; 3 (format 11) dk and dv;
/// 4 (format 12) dq, dk and dv.
struct AttentionGradSteps {
  int First = 0, Count = 0;
};
inline AttentionGradSteps attentionGradSteps(int64_t Which) {
  if (Which >= 0 && Which <= 2)
    return {int(Which), 1};
  if (Which == 3)
    return {1, 2};
  if (Which == 4)
    return {0, 3};
  return {};
}

/// Whether an instruction of \p Op may write its output \p Output into the
/// buffer of its input \p Input (in place): adam_w its parameter (input
/// 0), all_reduce its sum over its partial sum (output k, input k), and
/// embedding_grad over the gradient it adds (input 3, format 13). Every
/// other instruction writes buffers none of its inputs is (the verifier
/// checks it; the backends rely on it).
inline bool updatesInPlace(op::OpCode Op, size_t Input, size_t Output) {
  return (Op == op::AdamW && Input == 0 && Output == 0) ||
         (Op == op::AllReduce && Input == Output) ||
         (Op == op::EmbeddingGrad && Input == 3 && Output == 0);
}

} // namespace megac_rt

#endif // MEGAC_RT_PLAN_ENUMS_H
