//===- device_run.h - A plan on a device, behind a C entry ------*- C++ -*-===//
//
// megac-run stays free of CUDA: the CUDA backend is a plugin
// (libmegac_cuda.so, built where the CUDA toolkit is) that megac-run loads
// with dlopen for `--backend cuda`. This header is all the two share.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_DEVICE_RUN_H
#define MEGAC_RT_DEVICE_RUN_H

#include "plan_generated.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace megac_rt {

/// One rank's program on a device: its buffers live in device memory.
class DeviceRun {
public:
  virtual ~DeviceRun() = default;
  /// Copies \p Bytes of host data into buffer \p Id (parameters, inputs).
  virtual void upload(uint32_t Id, const void *Data, size_t Bytes) = 0;
  /// Copies buffer \p Id back to the host.
  virtual void download(uint32_t Id, void *Data, size_t Bytes) = 0;
  /// What the next instructions read besides buffers: the optimizer step
  /// \p Step (1-based; also keys dropout masks), the learning rate, the
  /// run's seed and the plan's micro-batches per step (dropout keys count
  /// micro-batches). Before any call: step 1, the plan's seed.
  virtual void setStep(int64_t Step, double Lr, uint64_t Seed) = 0;
  /// Pipelines: how many copies of a micro-batch's buffers the rank keeps
  /// (the memory plan's slots; 1 without a pipeline), and which one the
  /// next instructions use.
  virtual uint32_t slots() const = 0;
  virtual void activateSlot(uint32_t Slot) = 0;
  /// Inference (generation): dropout is the identity. Off by default.
  virtual void setInference(bool On) = 0;
  /// Runs instructions [Begin, End) once, as micro-batch \p Micro of the
  /// step (gradient accumulation); \p Training skips generation-only
  /// instructions (the logits). Throws std::runtime_error naming the
  /// instruction when one cannot run on the device.
  virtual void run(uint32_t Begin, uint32_t End, int64_t Micro,
                   bool Training) = 0;
  /// The AdamW moments of instruction \p Instr (\p N floats each): copied
  /// to the host (checkpoints), or from it when \p ToDevice (resume).
  virtual void moments(uint32_t Instr, float *M, float *V, size_t N,
                       bool ToDevice) = 0;
  /// "NVIDIA H100 80GB HBM3 (sm_90)".
  virtual std::string deviceName() const = 0;
  /// What computes attention: "cuDNN" where cuDNN's fused attention was
  /// opened (asked for, or by default and present), else "megac's
  /// kernels"; part of a checkpoint's arithmetic record.
  virtual std::string attentionKernels() const = 0;
  /// How the plan maps onto the device ("48 of 60 products on bf16
  /// values ..."), for megac-run's log.
  virtual std::string notes() const = 0;
  /// What the runs so far did that the plan alone does not say ("16 of 16
  /// attention gradients from their forward's statistics"); "" if nothing.
  virtual std::string runNotes() const { return ""; }
  /// Times every instruction run from now on with device events (which
  /// serialize nothing, but cost a little): see profile().
  virtual void enableProfiling() = 0;
  /// Per instruction of the rank program: milliseconds on the device and
  /// runs, summed since enableProfiling() over the steps after the first
  /// this device ran (which loads kernels, plans and times products and
  /// grows scratch: not what a step costs), or over the first where it
  /// ran no other. Returns the steps summed, and whether the first was
  /// left out.
  struct ProfiledSteps {
    int64_t Steps = 0;
    bool FirstLeftOut = false;
  };
  virtual ProfiledSteps profile(std::vector<double> &Ms,
                                std::vector<uint64_t> &Runs) const = 0;
  /// Aborts the communicators (ncclCommAbort), so that a rank the
  /// launcher's watchdog ends does not hang in a collective on its way
  /// out. May be called from another thread while run() waits.
  virtual void abort() = 0;
};

} // namespace megac_rt

/// What the plugin needs from the launcher.
struct DeviceBootstrap {
  /// Sets up communicators (NCCL's unique ids travel over megac-run's
  /// MPI): every rank's \p Bytes bytes of \p Mine, in world-rank order,
  /// into \p All. Collective over the world; false on failure.
  bool (*allGather)(const void *Mine, size_t Bytes, void *All, void *Ctx);
  /// Progress, for the launcher's watchdog: instruction \p Instr is being
  /// issued, or (\p Waiting) the host waits for the device to finish what
  /// was issued up to it. May be null.
  void (*progress)(uint32_t Instr, bool Waiting, void *Ctx);
  /// A pipeline transfer: \p Bytes of \p Data to rank \p Peer (\p Send:
  /// returns once the launcher has its copy) or from it (waits for the
  /// message), keyed by \p Tag. False on failure.
  bool (*transfer)(int Peer, int64_t Tag, void *Data, size_t Bytes, bool Send,
                   void *Ctx);
  void *Ctx;
};

/// The plugin's entry: rank \p Rank of \p P on device \p Device, its
/// communicators (one per grid axis) set up through \p Boot; null with a
/// message in \p Err when there is no usable device. Collective over the
/// world when the plan has more than one rank.
extern "C" megac_rt::DeviceRun *
megacCreateCudaRun(const megac::plan::Program *P, uint32_t Rank, int Device,
                   const DeviceBootstrap *Boot, char *Err, size_t ErrSize);

#endif // MEGAC_RT_DEVICE_RUN_H
