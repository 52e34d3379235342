//===- GPT2Importer.cpp - HuggingFace GPT-2 config to megac IR ------------===//
//
// The generated model follows HF GPT-2 exactly (pre-LayerNorm blocks, tanh
// GeLU, tied output embedding) so that HF checkpoints load by name. GPT-2's
// fused c_attn projection is split into q, k and v parameters that point at
// slices of the same HF tensor: a column split of the fused [H, 3H] weight
// would hand each rank a mix of q, k and v columns, while separate q/k/v
// weights split cleanly by heads.
//
//===----------------------------------------------------------------------===//

#include "megac/Frontend/GPT2Importer.h"

#include "megac/Dialect/Megac/IR/MegacOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MathExtras.h"
#include <algorithm>
#include <cmath>
#include <limits>

using namespace mlir;

namespace megac {

/// The deepest nesting of arrays and objects in JSON \p text (brackets
/// inside strings not counted), without parsing it.
static int jsonDepth(llvm::StringRef text) {
  int depth = 0, deepest = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i; // the escaped character, a quote among them
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

llvm::Expected<GPT2Config> parseGPT2Config(llvm::StringRef text) {
  auto fail = [](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   message.str());
  };
  // Editors on Windows may start the file with a UTF-8 byte-order mark,
  // which JSON parsers (Python's json.load among them) skip.
  text.consume_front("\xEF\xBB\xBF");
  // LLVM's JSON parser recurses once per level: 50000 brackets overflowed
  // the stack. A config is a few levels deep.
  constexpr int kMaxDepth = 64;
  if (jsonDepth(text) > kMaxDepth)
    return fail(llvm::formatv("JSON nested more than {0} levels deep: not a "
                              "HuggingFace config",
                              kMaxDepth)
                    .str());
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
  if (!parsed)
    return fail("invalid JSON: " + llvm::toString(parsed.takeError()));
  const llvm::json::Object *object = parsed->getAsObject();
  if (!object)
    return fail("the config must be a JSON object");
  if (const llvm::json::Value *type = object->get("model_type")) {
    std::optional<llvm::StringRef> name = type->getAsString();
    if (!name)
      return fail("'model_type' must be a string (\"gpt2\")");
    if (*name != "gpt2")
      return fail("model_type '" + *name +
                  "' is not supported yet (only GPT-2-family configs are)");
  } else {
    // Without model_type (as HF reads it, a GPT-2 config by the caller's
    // choice), a config of another family must not pass for GPT-2 by its
    // generic keys (num_hidden_layers, hidden_size, ...): its own say what
    // it is.
    const llvm::json::Value *archValue = object->get("architectures");
    const llvm::json::Array *archs =
        archValue ? archValue->getAsArray() : nullptr;
    if (archValue && !archs && !archValue->getAsNull())
      return fail("'architectures' must be a list of model class names "
                  "([\"GPT2LMHeadModel\"])");
    if (archs)
      for (const llvm::json::Value &arch : *archs) {
        std::optional<llvm::StringRef> name = arch.getAsString();
        if (!name || !name->starts_with("GPT2"))
          return fail(
              "'architectures' names " +
              (name ? "'" + name->str() + "'" : std::string("a non-string")) +
              ", not a GPT-2 model (GPT2LMHeadModel, ...); megac "
              "imports GPT-2-family configs only");
      }
    for (llvm::StringRef key :
         {"hidden_act", "rms_norm_eps", "num_key_value_heads", "rope_theta",
          "rope_scaling", "type_vocab_size", "position_embedding_type"})
      if (object->get(key))
        return fail("'" + key +
                    "' is a key of another model family (GPT-2 configs "
                    "have none), and there is no model_type; megac imports "
                    "GPT-2-family configs only");
  }

  GPT2Config config;
  // Returns the key among `names` (GPT-2's name and HF's generic alias) as
  // a positive integer; both given must agree.
  auto getInt = [&](std::initializer_list<llvm::StringRef> names,
                    int64_t &out) -> llvm::Error {
    llvm::StringRef found;
    for (llvm::StringRef name : names) {
      const llvm::json::Value *value = object->get(name);
      if (!value)
        continue;
      std::optional<int64_t> number = value->getAsInteger();
      if (!number || *number <= 0)
        return fail("'" + name + "' must be a positive integer");
      if (!found.empty() && *number != out)
        return fail(llvm::formatv("'{0}' ({1}) and '{2}' ({3}) disagree", found,
                                  out, name, *number)
                        .str());
      found = name;
      out = *number;
    }
    if (found.empty())
      return fail("missing '" + *names.begin() + "'");
    return llvm::Error::success();
  };
  if (auto err = getInt({"n_layer", "num_hidden_layers"}, config.numLayers))
    return std::move(err);
  if (auto err = getInt({"n_embd", "hidden_size"}, config.hidden))
    return std::move(err);
  if (auto err = getInt({"n_head", "num_attention_heads"}, config.numHeads))
    return std::move(err);
  if (auto err = getInt({"vocab_size"}, config.vocabSize))
    return std::move(err);
  if (auto err = getInt({"n_positions", "max_position_embeddings"},
                        config.maxPositions))
    return std::move(err);
  // n_inner is null in HF's own GPT-2 configs (4 x n_embd); given both
  // ways, the two must agree (as the other aliases).
  llvm::StringRef innerKey;
  for (llvm::StringRef name : {"n_inner", "intermediate_size"}) {
    const llvm::json::Value *value = object->get(name);
    if (!value || value->getAsNull())
      continue;
    std::optional<int64_t> number = value->getAsInteger();
    if (!number || *number <= 0)
      return fail("'" + name + "' must be a positive integer or null");
    if (!innerKey.empty() && *number != config.inner)
      return fail(llvm::formatv("'{0}' ({1}) and '{2}' ({3}) disagree",
                                innerKey, config.inner, name, *number)
                      .str());
    innerKey = name;
    config.inner = *number;
  }
  // What megac's GPT-2 block computes; a config asking for something else
  // would otherwise import as a different model without a word.
  if (const llvm::json::Value *value = object->get("activation_function")) {
    std::optional<llvm::StringRef> act = value->getAsString();
    // HF's gelu_new, gelu_pytorch_tanh and gelu_fast are all
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), megac's megac.gelu.
    if (!act || !llvm::is_contained(llvm::ArrayRef<llvm::StringRef>{
                                        "gelu_new", "gelu_pytorch_tanh",
                                        "gelu_fast"},
                                    *act))
      return fail("'activation_function' " +
                  (act ? "'" + act->str() + "'" : std::string("(not a string)")) +
                  " is not supported: megac's GPT-2 uses GeLU's tanh form "
                  "(gelu_new, gelu_pytorch_tanh or gelu_fast)");
  }
  auto requireFlag = [&](llvm::StringRef name, bool wanted,
                         llvm::StringRef why) -> llvm::Error {
    const llvm::json::Value *value = object->get(name);
    if (!value)
      return llvm::Error::success();
    std::optional<bool> flag = value->getAsBoolean();
    if (!flag)
      return fail("'" + name + "' must be true or false");
    if (*flag != wanted)
      return fail("'" + name + "': " + (wanted ? "false" : "true") +
                  " is not supported (" + why + ")");
    return llvm::Error::success();
  };
  if (auto err = requireFlag("scale_attn_weights", true,
                             "megac's attention scales its scores by "
                             "1/sqrt(head size)"))
    return std::move(err);
  if (auto err = requireFlag("scale_attn_by_inverse_layer_idx", false,
                             "megac's attention does not scale its scores "
                             "by layer"))
    return std::move(err);
  if (auto err = requireFlag("add_cross_attention", false,
                             "megac builds decoder-only models"))
    return std::move(err);
  // Both are float32 in the model: a value past its range would become
  // infinity (or, below its normal numbers, lose its digits or become 0).
  auto getPositiveFloat = [&](llvm::StringRef name,
                              double &out) -> llvm::Error {
    const llvm::json::Value *value = object->get(name);
    if (!value)
      return llvm::Error::success();
    std::optional<double> number = value->getAsNumber();
    if (!number || !(*number >= std::numeric_limits<float>::min() &&
                     *number <= std::numeric_limits<float>::max()))
      return fail("'" + name +
                  "' must be a positive number within float32's range "
                  "(1.2e-38 to 3.4e38)");
    out = *number;
    return llvm::Error::success();
  };
  if (auto err =
          getPositiveFloat("layer_norm_epsilon", config.layerNormEpsilon))
    return std::move(err);
  if (auto err = getPositiveFloat("initializer_range", config.initStd))
    return std::move(err);
  auto getRate = [&](llvm::StringRef name, double &out) -> llvm::Error {
    if (const llvm::json::Value *value = object->get(name)) {
      std::optional<double> rate = value->getAsNumber();
      if (!rate || !(*rate >= 0.0 && *rate < 1.0))
        return fail("'" + name + "' must be a number in [0, 1)");
      out = *rate;
    }
    return llvm::Error::success();
  };
  if (auto err = getRate("embd_pdrop", config.embeddingDropout))
    return std::move(err);
  if (auto err = getRate("resid_pdrop", config.residualDropout))
    return std::move(err);
  if (auto err = getRate("attn_pdrop", config.attentionDropout))
    return std::move(err);
  if (const llvm::json::Value *tied = object->get("tie_word_embeddings")) {
    std::optional<bool> flag = tied->getAsBoolean();
    if (!flag)
      return fail("'tie_word_embeddings' must be true or false");
    config.tieEmbeddings = *flag;
  }
  if (auto name = object->getString("_name_or_path"))
    if (!name->empty())
      config.name = name->str();
  if (config.hidden % config.numHeads != 0)
    return fail(llvm::formatv("n_embd ({0}) must be divisible by n_head ({1})",
                              config.hidden, config.numHeads)
                    .str());
  // Sizes no plan can hold: each parameter within a plan buffer's 2^40
  // elements (checked here, where the config's keys can be named, rather
  // than as an invalid model later), and a depth the compiler builds in
  // reasonable time and memory.
  // (kMaxElements is megac_rt::kMaxBufferElements, which the runtime
  // refuses past; the frontend does not depend on the runtime's headers.)
  constexpr int64_t kMaxElements = int64_t(1) << 40, kMaxLayers = 10000;
  if (config.numLayers > kMaxLayers)
    return fail(llvm::formatv("n_layer ({0}) exceeds {1} layers",
                              config.numLayers, kMaxLayers)
                    .str());
  if (config.hidden > kMaxElements) // (so that 4 x n_embd cannot overflow)
    return fail(
        llvm::formatv("n_embd ({0}) exceeds 2^40", config.hidden).str());
  for (auto [rows, rowsName] :
       {std::pair<int64_t, const char *>{config.vocabSize, "vocab_size"},
        {config.maxPositions, "n_positions"},
        {mlpWidth(config), "the MLP width (n_inner)"},
        {3 * config.hidden, "3 x n_embd"}}) {
    int64_t elements;
    if (llvm::MulOverflow(rows, config.hidden, elements) ||
        elements > kMaxElements)
      return fail(llvm::formatv("a parameter of {0} ({1}) x n_embd ({2}) "
                                "would exceed 2^40 elements",
                                rowsName, rows, config.hidden)
                      .str());
  }
  return config;
}

GPT2Config getTinyGPT2Config() {
  GPT2Config config;
  config.name = "gpt2-tiny";
  config.numLayers = 4;
  config.hidden = 128;
  config.numHeads = 4;
  config.vocabSize = 512;
  config.maxPositions = 128;
  return config;
}

namespace {

/// Collects parameters as function arguments while the body is built.
class ModelBuilder {
public:
  ModelBuilder(MLIRContext *ctx, const GPT2Config &config)
      : ctx(ctx), config(config), builder(ctx) {}

  struct ParamSpec {
    std::string name;
    SmallVector<int64_t> shape;
    std::string init; // normal | zeros | ones
    double std = 0.0;
    SmallVector<StringRef> sharding; // per dim: "" or "tp"
    std::string hfName;
    SmallVector<int64_t> hfOffset;
    /// The HF tensor's shape where it has fewer rows (a padded vocabulary).
    SmallVector<int64_t> hfShape;
  };

  /// Declares a parameter; returns its index among the arguments.
  unsigned param(ParamSpec spec) {
    params.push_back(std::move(spec));
    return params.size() - 1;
  }

  OwningOpRef<ModuleOp> build();

private:
  DictionaryAttr paramAttrs(const ParamSpec &spec);

  MLIRContext *ctx;
  const GPT2Config &config;
  OpBuilder builder;
  std::vector<ParamSpec> params;
};

DictionaryAttr ModelBuilder::paramAttrs(const ParamSpec &spec) {
  SmallVector<NamedAttribute> fields = {
      builder.getNamedAttr("name", builder.getStringAttr(spec.name)),
      builder.getNamedAttr("init", builder.getStringAttr(spec.init))};
  if (spec.init == "normal")
    fields.push_back(builder.getNamedAttr("std", builder.getF64FloatAttr(spec.std)));
  if (!spec.hfName.empty() && spec.hfName != spec.name)
    fields.push_back(
        builder.getNamedAttr("hf_name", builder.getStringAttr(spec.hfName)));
  if (llvm::any_of(spec.hfOffset, [](int64_t v) { return v != 0; }))
    fields.push_back(builder.getNamedAttr(
        "hf_offset", builder.getDenseI64ArrayAttr(spec.hfOffset)));
  if (!spec.hfShape.empty())
    fields.push_back(builder.getNamedAttr(
        "hf_shape", builder.getDenseI64ArrayAttr(spec.hfShape)));
  SmallVector<NamedAttribute> attrs = {builder.getNamedAttr(
      MegacDialect::kParamAttrName, builder.getDictionaryAttr(fields))};
  if (config.tensorParallel &&
      llvm::any_of(spec.sharding, [](StringRef s) { return !s.empty(); })) {
    SmallVector<StringAttr> dims;
    for (StringRef axis : spec.sharding)
      dims.push_back(builder.getStringAttr(axis));
    attrs.push_back(builder.getNamedAttr(MegacDialect::kShardingAttrName,
                                         ShardingAttr::get(ctx, dims, {})));
  }
  return builder.getDictionaryAttr(attrs);
}

OwningOpRef<ModuleOp> ModelBuilder::build() {
  // V: the tables' rows; config.vocabSize of them are real tokens.
  const int64_t H = config.hidden, V = paddedVocab(config),
                L = config.numLayers;
  const bool padded = V != config.vocabSize;
  SmallVector<int64_t> vocabShape;
  if (padded)
    vocabShape = {config.vocabSize, H};
  const int64_t F = mlpWidth(config);
  const int64_t D = ShapedType::kDynamic;
  const double std = config.initStd;
  // Megatron scales the init of the projections that write into the residual
  // stream by 1/sqrt(2L).
  const double outStd = std / std::sqrt(2.0 * L);
  auto f32 = builder.getF32Type();
  auto tensor = [&](ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, f32);
  };

  // Parameters, in the order HF lists them.
  unsigned wte = param({"wte.weight", {V, H}, "normal", std, {"tp", ""}, "",
                        {}, vocabShape});
  unsigned wpe = param({"wpe.weight", {config.maxPositions, H}, "normal", std, {"", ""}});
  struct Layer {
    unsigned ln1w, ln1b, q, k, v, qb, kb, vb, proj, projb, ln2w, ln2b, fc, fcb,
        out, outb;
  };
  SmallVector<Layer> layers;
  for (int64_t l = 0; l < L; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    Layer layer;
    layer.ln1w = param({p + "ln_1.weight", {H}, "ones", 0, {""}});
    layer.ln1b = param({p + "ln_1.bias", {H}, "zeros", 0, {""}});
    const char *qkv[] = {"q", "k", "v"};
    unsigned *weights[] = {&layer.q, &layer.k, &layer.v};
    unsigned *biases[] = {&layer.qb, &layer.kb, &layer.vb};
    for (int i = 0; i < 3; ++i) {
      // Column-parallel: each rank owns whole heads of q, k and v.
      *weights[i] = param({p + "attn." + qkv[i] + ".weight", {H, H}, "normal",
                           std, {"", "tp"}, p + "attn.c_attn.weight", {0, i * H}});
      *biases[i] = param({p + "attn." + qkv[i] + ".bias", {H}, "zeros", 0,
                          {"tp"}, p + "attn.c_attn.bias", {i * H}});
    }
    // Row-parallel output projection; its bias is added after the all-reduce.
    layer.proj = param({p + "attn.c_proj.weight", {H, H}, "normal", outStd, {"tp", ""}});
    layer.projb = param({p + "attn.c_proj.bias", {H}, "zeros", 0, {""}});
    layer.ln2w = param({p + "ln_2.weight", {H}, "ones", 0, {""}});
    layer.ln2b = param({p + "ln_2.bias", {H}, "zeros", 0, {""}});
    layer.fc = param({p + "mlp.c_fc.weight", {H, F}, "normal", std, {"", "tp"}});
    layer.fcb = param({p + "mlp.c_fc.bias", {F}, "zeros", 0, {"tp"}});
    layer.out = param({p + "mlp.c_proj.weight", {F, H}, "normal", outStd, {"tp", ""}});
    layer.outb = param({p + "mlp.c_proj.bias", {H}, "zeros", 0, {""}});
    layers.push_back(layer);
  }
  unsigned lnfw = param({"ln_f.weight", {H}, "ones", 0, {""}});
  unsigned lnfb = param({"ln_f.bias", {H}, "zeros", 0, {""}});
  unsigned lmHead = wte;
  if (!config.tieEmbeddings)
    lmHead = param({"lm_head.weight", {V, H}, "normal", std, {"tp", ""}, "",
                    {}, vocabShape});

  SmallVector<Type> argTypes;
  SmallVector<DictionaryAttr> argAttrs;
  for (const ParamSpec &spec : params) {
    argTypes.push_back(tensor(spec.shape));
    argAttrs.push_back(paramAttrs(spec));
  }
  auto ids = RankedTensorType::get({D, D}, builder.getI32Type());
  // Data is split by batch rows over the data-parallel axis `dp` (whole
  // on grids without it).
  auto batchSplit = ShardingAttr::get(
      ctx, {builder.getStringAttr("dp"), builder.getStringAttr("")}, {});
  for (StringRef kind : {"tokens", "labels"}) {
    argTypes.push_back(ids);
    argAttrs.push_back(builder.getDictionaryAttr(
        {builder.getNamedAttr(MegacDialect::kInputAttrName,
                              builder.getStringAttr(kind)),
         builder.getNamedAttr(MegacDialect::kShardingAttrName, batchSplit)}));
  }

  Location loc = NameLoc::get(builder.getStringAttr(config.name));
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  module->getOperation()->setAttr(MegacDialect::kModelAttrName,
                                  builder.getStringAttr(config.name));
  builder.setInsertionPointToEnd(module->getBody());
  auto resultTypes = SmallVector<Type>{tensor({D, D, V}), tensor({})};
  auto func = func::FuncOp::create(builder, loc, "forward",
                                   builder.getFunctionType(argTypes, resultTypes));
  func.setAllArgAttrs(argAttrs);
  func.setResultAttr(0, MegacDialect::kResultNameAttrName,
                     builder.getStringAttr("logits"));
  func.setResultAttr(1, MegacDialect::kResultNameAttrName,
                     builder.getStringAttr("loss"));
  Block *body = func.addEntryBlock();
  builder.setInsertionPointToStart(body);
  auto arg = [&](unsigned index) -> Value { return body->getArgument(index); };
  Value tokens = body->getArgument(params.size());
  Value labels = body->getArgument(params.size() + 1);
  auto at = [&](const std::string &name) {
    return NameLoc::get(builder.getStringAttr(name));
  };
  auto eps = builder.getF64FloatAttr(config.layerNormEpsilon);
  int64_t streams = 0;
  auto dropout = [&](Location l, Value x, double rate) -> Value {
    if (rate <= 0.0)
      return x;
    return DropoutOp::create(builder, l, x, builder.getF64FloatAttr(rate),
                             builder.getI64IntegerAttr(streams++));
  };
  auto dense = [&](Location l, Value x, unsigned w, unsigned b) -> Value {
    Value y = LinearOp::create(builder, l, x, arg(w), /*transpose=*/false);
    return AddOp::create(builder, l, y, arg(b));
  };

  // Separate statements: argument evaluation order would otherwise decide
  // the order of the ops.
  Value tokenEmbedding = EmbeddingOp::create(builder, at("wte"), arg(wte), tokens);
  Value positionEmbedding =
      PositionEmbeddingOp::create(builder, at("wpe"), arg(wpe), tokens);
  Value x = dropout(at("embeddings.dropout"),
                    AddOp::create(builder, at("embeddings"), tokenEmbedding,
                                  positionEmbedding),
                    config.embeddingDropout);
  for (auto [l, layer] : llvm::enumerate(layers)) {
    std::string p = "h." + std::to_string(l) + ".";
    Value a = LayerNormOp::create(builder, at(p + "ln_1"), x, arg(layer.ln1w),
                                  arg(layer.ln1b), eps);
    Value q = dense(at(p + "attn.q"), a, layer.q, layer.qb);
    Value k = dense(at(p + "attn.k"), a, layer.k, layer.kb);
    Value v = dense(at(p + "attn.v"), a, layer.v, layer.vb);
    // Probability dropout happens inside the fused op, with its own stream.
    double attnRate = config.attentionDropout;
    Value attn = AttentionOp::create(
        builder, at(p + "attn"), q, k, v,
        builder.getI64IntegerAttr(config.numHeads), builder.getBoolAttr(true),
        builder.getF64FloatAttr(attnRate),
        builder.getI64IntegerAttr(attnRate > 0.0 ? streams++ : 0));
    x = AddOp::create(
        builder, at(p + "residual_1"), x,
        dropout(at(p + "attn.dropout"),
                dense(at(p + "attn.c_proj"), attn, layer.proj, layer.projb),
                config.residualDropout));
    Value m = LayerNormOp::create(builder, at(p + "ln_2"), x, arg(layer.ln2w),
                                  arg(layer.ln2b), eps);
    Value h = GeluOp::create(builder, at(p + "mlp.gelu"),
                             dense(at(p + "mlp.c_fc"), m, layer.fc, layer.fcb));
    x = AddOp::create(
        builder, at(p + "residual_2"), x,
        dropout(at(p + "mlp.dropout"),
                dense(at(p + "mlp.c_proj"), h, layer.out, layer.outb),
                config.residualDropout));
  }
  Value f = LayerNormOp::create(builder, at("ln_f"), x, arg(lnfw), arg(lnfb), eps);
  Value logits = LinearOp::create(builder, at("lm_head"), f, arg(lmHead),
                                  /*transpose=*/true);
  // Padding rows are no classes: the loss leaves their logits out.
  Value loss = CrossEntropyOp::create(
      builder, at("loss"), logits, labels,
      padded ? builder.getI64IntegerAttr(config.vocabSize) : IntegerAttr());
  func::ReturnOp::create(builder, loc, ValueRange{logits, loss});
  return module;
}

} // namespace

OwningOpRef<ModuleOp> buildGPT2Module(MLIRContext *ctx,
                                      const GPT2Config &config) {
  ctx->loadDialect<MegacDialect, func::FuncDialect>();
  return ModelBuilder(ctx, config).build();
}

} // namespace megac
