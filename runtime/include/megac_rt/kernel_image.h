//===- kernel_image.h - Which kernel binary a device loads -----*- C++ -*-===//
//
// A plan carries each generated kernel as cubins ("sm_80", "sm_90") and as
// PTX for a virtual architecture ("compute_90"). A cubin runs on its own
// architecture and on later minor versions of the same major one (sm_80 on
// sm_86 and sm_89), never on another major one; PTX for compute_XY is
// compiled by the driver for any architecture from XY on (an sm_100 GPU
// loads compute_90's PTX). Kept free of CUDA, so that the choice is tested
// on any machine (KernelImageTest.cpp), and shared with megac, which reads
// the same names in `--cuda-arch` and `megac inspect`.
//
//===----------------------------------------------------------------------===//

#ifndef MEGAC_RT_KERNEL_IMAGE_H
#define MEGAC_RT_KERNEL_IMAGE_H

#include <string>
#include <vector>

namespace megac_rt {

/// An architecture name read: "sm_90" is {90, false}, "compute_90" {90,
/// true}. A suffix narrows where the binary runs: "a" (sm_90a,
/// compute_90a: arch-specific) to that exact architecture, "f" (sm_100f:
/// family-specific) to that major version from its minor on. Version 0:
/// not a name of either kind.
struct ArchName {
  int Version = 0;
  bool Ptx = false;
  char Suffix = 0; // 0, 'a' or 'f'
};

/// Whether a binary named \p A runs on a device of compute capability
/// \p Device (major * 10 + minor).
inline bool archRunsOn(const ArchName &A, int Device) {
  if (!A.Version || A.Version > Device)
    return false;
  if (A.Suffix == 'a')
    return A.Version == Device;
  // A cubin, and family-specific PTX, stay within their major version.
  if (!A.Ptx || A.Suffix == 'f')
    return A.Version / 10 == Device / 10;
  return true;
}

inline ArchName parseArch(const std::string &Name) {
  ArchName A;
  size_t Pos = 0;
  if (Name.rfind("sm_", 0) == 0)
    Pos = 3;
  else if (Name.rfind("compute_", 0) == 0) {
    Pos = 8;
    A.Ptx = true;
  } else
    return {};
  size_t End = Pos;
  while (End < Name.size() && Name[End] >= '0' && Name[End] <= '9')
    ++End;
  if (End == Pos || End - Pos > 4)
    return {};
  A.Version = std::stoi(Name.substr(Pos, End - Pos));
  if (End != Name.size()) {
    if (End + 1 != Name.size() || (Name[End] != 'a' && Name[End] != 'f'))
      return {};
    A.Suffix = Name[End];
  }
  return A;
}

/// Which binary a device of compute capability \p Major.\p Minor loads
/// among \p Archs (the kernel's binaries' names, in the plan's order):
/// its own cubin; else the newest cubin of its major version below it;
/// else the newest PTX it can compile; -1 where none runs there. With
/// \p PreferPtx, the PTX wherever one can run (the path a later GPU
/// takes, for a test on this one).
inline int pickKernelImage(const std::vector<std::string> &Archs, int Major,
                           int Minor, bool PreferPtx = false) {
  const int Device = Major * 10 + Minor;
  int Cubin = -1, CubinVersion = -1, Ptx = -1, PtxVersion = -1;
  for (size_t I = 0; I < Archs.size(); ++I) {
    const ArchName A = parseArch(Archs[I]);
    if (!archRunsOn(A, Device))
      continue;
    int &Best = A.Ptx ? Ptx : Cubin;
    int &BestVersion = A.Ptx ? PtxVersion : CubinVersion;
    if (A.Version > BestVersion) {
      Best = int(I);
      BestVersion = A.Version;
    }
  }
  if (PreferPtx && Ptx >= 0)
    return Ptx;
  return Cubin >= 0 ? Cubin : Ptx;
}

} // namespace megac_rt

#endif // MEGAC_RT_KERNEL_IMAGE_H
