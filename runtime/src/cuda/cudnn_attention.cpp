//===- cudnn_attention.cpp - cuDNN's fused attention for the backend ------===//
//
// Three graphs per attention shape, built once and cached: the forward
// with the rows' statistics (what the backward pass recomputes), the
// forward without (the forward pass), and the backward. Tensors travel by
// uid; the workspace grows to the largest plan's need.
//
//===----------------------------------------------------------------------===//

#include "cudnn_attention.h"

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include "growing_buffer.h"
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <tuple>
#include <unordered_map>

// The frontend, built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, calls
// cuDNN through this handle (dlopen'ed in loadCudnn).
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
} // namespace cudnn_frontend

namespace megac_rt::cuda {
namespace fe = cudnn_frontend;

bool SdpaShape::operator<(const SdpaShape &O) const {
  return std::tie(B, S, NH, D, Causal, Scale) <
         std::tie(O.B, O.S, O.NH, O.D, O.Causal, O.Scale);
}

namespace {

/// Loads cuDNN once (MEGAC_CUDNN_LIBRARY, else libcudnn.so.9); "" or why
/// not.
std::string loadCudnn() {
  static const std::string Why = [] {
    // The frontend calls the CUDA runtime through a dlopen of its own and
    // takes the first of libcudart.so.12 and .13 it finds: the one this
    // plugin runs on, unless the user names another.
    const std::string Cudart =
        "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", Cudart.c_str(), /*overwrite=*/0);
    const char *Env = std::getenv("MEGAC_CUDNN_LIBRARY");
    const std::string Name = Env && *Env ? Env : "libcudnn.so.9";
    fe::cudnn_dlhandle = dlopen(Name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle) {
      const char *E = dlerror();
      return "cannot load " + Name + " (" + (E ? E : "?") +
             "; MEGAC_CUDNN_LIBRARY names another)";
    }
    const size_t Version = fe::detail::get_backend_version();
    if (Version < 90000)
      return "cuDNN " + std::to_string(Version) + " is older than 9.0";
    return std::string();
  }();
  return Why;
}

enum Uid : int64_t { kQ = 1, kK, kV, kY, kStats, kDY, kDQ, kDK, kDV };

/// q, k, v, y and their gradients: [B, NH, S, D] over megac's [B, S, NH *
/// D] storage.
std::vector<int64_t> dims(const SdpaShape &Sh) {
  return {Sh.B, Sh.NH, Sh.S, Sh.D};
}
std::vector<int64_t> strides(const SdpaShape &Sh) {
  return {Sh.S * Sh.NH * Sh.D, Sh.D, Sh.NH * Sh.D, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> bf16Tensor(fe::graph::Graph &G,
                                                         const SdpaShape &Sh,
                                                         const char *Name,
                                                         int64_t Id) {
  return G.tensor(fe::graph::Tensor_attributes()
                      .set_name(Name)
                      .set_uid(Id)
                      .set_dim(dims(Sh))
                      .set_stride(strides(Sh))
                      .set_data_type(fe::DataType_t::BFLOAT16));
}

/// A graph of bf16 tensors with fp32 arithmetic, for compute capability
/// \p Sm (0: the current device's; set before any node, which copies it).
std::shared_ptr<fe::graph::Graph> newGraph(int Sm) {
  auto G = std::make_shared<fe::graph::Graph>();
  if (Sm > 0)
    G->set_sm_version(Sm);
  G->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return G;
}

/// The forward graph (with the rows' log-sum-exp where \p Stats).
std::shared_ptr<fe::graph::Graph> forwardGraph(const SdpaShape &Sh, bool Stats,
                                               int Sm = 0) {
  auto G = newGraph(Sm);
  auto Q = bf16Tensor(*G, Sh, "q", kQ), K = bf16Tensor(*G, Sh, "k", kK),
       V = bf16Tensor(*G, Sh, "v", kV);
  auto Opts = fe::graph::SDPA_attributes()
                  .set_name("attention")
                  .set_generate_stats(Stats)
                  .set_causal_mask(Sh.Causal)
                  .set_attn_scale(Sh.Scale);
  auto [Y, L] = G->sdpa(Q, K, V, Opts);
  Y->set_output(true).set_dim(dims(Sh)).set_stride(strides(Sh)).set_uid(kY);
  if (Stats)
    L->set_output(true)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({Sh.B, Sh.NH, Sh.S, 1})
        .set_stride({Sh.NH * Sh.S, Sh.S, 1, 1})
        .set_uid(kStats);
  return G;
}

std::shared_ptr<fe::graph::Graph>
backwardGraph(const SdpaShape &Sh, bool Deterministic, int Sm = 0) {
  auto G = newGraph(Sm);
  auto Q = bf16Tensor(*G, Sh, "q", kQ), K = bf16Tensor(*G, Sh, "k", kK),
       V = bf16Tensor(*G, Sh, "v", kV), Y = bf16Tensor(*G, Sh, "y", kY),
       DY = bf16Tensor(*G, Sh, "dy", kDY);
  auto Stats = G->tensor(fe::graph::Tensor_attributes()
                             .set_name("stats")
                             .set_uid(kStats)
                             .set_dim({Sh.B, Sh.NH, Sh.S, 1})
                             .set_stride({Sh.NH * Sh.S, Sh.S, 1, 1})
                             .set_data_type(fe::DataType_t::FLOAT));
  auto Opts = fe::graph::SDPA_backward_attributes()
                  .set_name("attention_grad")
                  .set_causal_mask(Sh.Causal)
                  .set_attn_scale(Sh.Scale)
                  .set_deterministic_algorithm(Deterministic);
  auto [DQ, DK, DV] = G->sdpa_backward(Q, K, V, Y, DY, Stats, Opts);
  const std::pair<std::shared_ptr<fe::graph::Tensor_attributes>, int64_t>
      Outs[] = {{DQ, kDQ}, {DK, kDK}, {DV, kDV}};
  for (const auto &[T, Id] : Outs)
    T->set_output(true).set_dim(dims(Sh)).set_stride(strides(Sh)).set_uid(Id);
  return G;
}

std::string message(fe::error_t E, const char *What) {
  return std::string(What) + ": " + E.get_message();
}

class CudnnAttentionImpl final : public CudnnAttention {
public:
  CudnnAttentionImpl(cudnnHandle_t H, bool Deterministic)
      : Handle(H), Deterministic(Deterministic) {}
  ~CudnnAttentionImpl() override {
    Graphs.clear();
    fe::detail::destroy_handle(Handle);
  }

  std::string forward(const SdpaShape &Sh, const void *Q, const void *K,
                      const void *V, void *Y, float *Stats,
                      cudaStream_t Stream) override {
    std::unordered_map<int64_t, void *> Ptrs = {{kQ, const_cast<void *>(Q)},
                                                {kK, const_cast<void *>(K)},
                                                {kV, const_cast<void *>(V)},
                                                {kY, Y}};
    if (Stats)
      Ptrs[kStats] = Stats;
    return run(Sh, Stats ? Kind::ForwardWithStats : Kind::Forward, Ptrs,
               Stream);
  }

  std::string backward(const SdpaShape &Sh, const void *Q, const void *K,
                       const void *V, const void *Y, const void *DY,
                       const float *Stats, void *DQ, void *DK, void *DV,
                       cudaStream_t Stream) override {
    std::unordered_map<int64_t, void *> Ptrs = {
        {kQ, const_cast<void *>(Q)},
        {kK, const_cast<void *>(K)},
        {kV, const_cast<void *>(V)},
        {kY, const_cast<void *>(Y)},
        {kDY, const_cast<void *>(DY)},
        {kStats, const_cast<float *>(Stats)},
        {kDQ, DQ},
        {kDK, DK},
        {kDV, DV}};
    return run(Sh, Kind::Backward, Ptrs, Stream);
  }

private:
  enum class Kind { Forward, ForwardWithStats, Backward };

  /// The built graph of \p Sh and \p K (cached; the reason it could not be
  /// built is cached too).
  std::string graph(const SdpaShape &Sh, Kind K,
                    std::shared_ptr<fe::graph::Graph> &Out) {
    auto It = Graphs.find({Sh, K});
    if (It == Graphs.end()) {
      Built B;
      B.Why = build(Sh, K, B.G);
      It = Graphs.emplace(std::make_pair(Sh, K), std::move(B)).first;
    }
    Out = It->second.G;
    return It->second.Why;
  }

  std::string build(const SdpaShape &Sh, Kind K,
                    std::shared_ptr<fe::graph::Graph> &Out) {
    std::string Why;
    // The backward pass deterministic where cuDNN has such a plan for it
    // and it is asked for (the same bits every run), else cuDNN's default.
    for (bool Exact : {Deterministic, false}) {
      auto G = K == Kind::Backward
                   ? backwardGraph(Sh, Exact)
                   : forwardGraph(Sh, K == Kind::ForwardWithStats);
      const char *Stage = "validate";
      fe::error_t E = G->validate();
      if (E.is_good()) {
        Stage = "build";
        E = G->build_operation_graph(Handle);
      }
      if (E.is_good())
        E = G->create_execution_plans({fe::HeurMode_t::A});
      if (E.is_good())
        E = G->check_support(Handle);
      if (E.is_good())
        E = G->build_plans(Handle);
      if (E.is_good()) {
        Out = G;
        return std::string();
      }
      // The first reason is the one to give (a backward pass without a
      // deterministic plan tries again without asking for one).
      if (Why.empty())
        Why = message(E, Stage);
      if (K != Kind::Backward || !Exact)
        break;
    }
    return Why;
  }

  std::string run(const SdpaShape &Sh, Kind K,
                  std::unordered_map<int64_t, void *> &Ptrs,
                  cudaStream_t Stream) {
    std::shared_ptr<fe::graph::Graph> G;
    if (std::string Why = graph(Sh, K, G); !Why.empty())
      return Why;
    int64_t Need = 0;
    if (auto E = G->get_workspace_size(Need); E.is_bad())
      return message(E, "workspace size");
    void *Ws = nullptr;
    try {
      Ws = Workspace.atLeast(size_t(Need), "cuDNN workspace");
    } catch (const std::exception &E) {
      return E.what();
    }
    if (fe::detail::set_stream(Handle, Stream) != CUDNN_STATUS_SUCCESS)
      return "cudnnSetStream failed";
    if (auto E = G->execute(Handle, Ptrs, Ws); E.is_bad())
      return message(E, "execute");
    return std::string();
  }

  struct Built {
    std::shared_ptr<fe::graph::Graph> G;
    std::string Why;
  };
  cudnnHandle_t Handle;
  /// Whether to ask for a deterministic backward pass first.
  bool Deterministic;
  std::map<std::pair<SdpaShape, Kind>, Built> Graphs;
  GrowingBuffer Workspace;
};

} // namespace

std::unique_ptr<CudnnAttention> CudnnAttention::open(std::string &Why,
                                                     bool Deterministic) {
  Why = loadCudnn();
  if (!Why.empty())
    return nullptr;
  cudnnHandle_t H = nullptr;
  if (const cudnnStatus_t S = fe::detail::create_handle(&H);
      S != CUDNN_STATUS_SUCCESS) {
    Why = std::string("cudnnCreate: ") + fe::detail::get_error_string(S);
    return nullptr;
  }
  return std::make_unique<CudnnAttentionImpl>(H, Deterministic);
}

std::string validateSdpaGraphs(const SdpaShape &Sh, int Sm) {
  if (std::string Why = loadCudnn(); !Why.empty())
    return Why;
  for (const auto &G : {forwardGraph(Sh, false, Sm), forwardGraph(Sh, true, Sm),
                        backwardGraph(Sh, true, Sm)})
    if (auto E = G->validate(); E.is_bad())
      return message(E, "validate");
  return std::string();
}

} // namespace megac_rt::cuda
