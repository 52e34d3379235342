#!/usr/bin/env bash
# Carries megac's build to a GPU machine that has the CUDA driver, toolkit
# and Python but neither MLIR, LLVM's test tools, Open MPI nor OpenBLAS
# (the `device` machines this project is lent), so that the lit suite and
# bench/gpu_step.py run there against the real GPU.
#
#   bash scripts/gpu_bundle.sh pack      # here: writes .gpu/bundle.tar.xz
#   bash scripts/gpu_bundle.sh install   # there, in the repository root
#
# `pack` builds megac and megac-opt linked statically against MLIR (build-static/,
# -DMEGAC_STATIC_MLIR=ON) and archives:
#  - build/bin (megac-run, the CUDA plugins, the unit tests, the static
#    tools) and the lit site configurations, which `install` points at the
#    repository there;
#  - LLVM's FileCheck, not, count and lit, and Open MPI (mpirun, orted,
#    ompi-server for torchrun launches, its components and help texts);
#  - every shared library those need that is not glibc or CUDA's own
#    (CUDA's come from the machine there, matching its driver).
# `install` unpacks the system files without overwriting any file the
# machine already has.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.gpu"
BUNDLE="$OUT/bundle.tar.xz"

# Shared libraries (resolved paths) that the given ELF files load, minus
# glibc's and CUDA's.
library_closure() {
  ldd "$@" 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    grep -v -E '^/usr/local/cuda|/libcuda\.so' || true
}

pack() {
  [[ -x "$ROOT/build/bin/megac-run" ]] || { echo "gpu_bundle: run scripts/build.sh first" >&2; exit 1; }
  echo "gpu_bundle: building megac with MLIR linked statically (build-static/)"
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/megac-ccache}"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$ROOT" -B "$ROOT/build-static" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMEGAC_STATIC_MLIR=ON "${launcher[@]}" >/dev/null
  ninja -C "$ROOT/build-static" -j "${MEGAC_JOBS:-$(nproc)}" megac megac-opt

  local stage="$OUT/stage"
  rm -rf "$stage" && mkdir -p "$stage/repo/build/bin" "$stage/repo/build/test/Unit" "$stage/sys"
  cp "$ROOT"/build/bin/{megac-run,libmegac_cuda.so,libmegac_cuda_emu.so,megac-plan-demo,megac-runtime-unittests} \
    "$ROOT"/build/bin/*-emu-unittests "$stage/repo/build/bin/"
  # cuDNN's attention graphs' unit test, where the build has the frontend.
  [[ -x "$ROOT/build/bin/megac-cudnn-unittests" ]] &&
    cp "$ROOT/build/bin/megac-cudnn-unittests" "$stage/repo/build/bin/"
  cp "$ROOT"/build-static/bin/{megac,megac-opt} "$stage/repo/build/bin/"
  cp "$ROOT/build/test/lit.site.cfg.py" "$stage/repo/build/test/"
  cp "$ROOT/build/test/Unit/lit.site.cfg.py" "$stage/repo/build/test/Unit/"
  strip "$stage"/repo/build/bin/megac*

  local llvm=/usr/lib/llvm-22 ompi=/usr/lib/x86_64-linux-gnu/openmpi
  local -a elves=("$stage"/repo/build/bin/* "$llvm"/bin/{FileCheck,not,count}
    /usr/bin/orterun /usr/bin/orted /usr/bin/ompi-server "$ompi"/lib/*.so
    "$ompi"/lib/openmpi3/*.so)
  local -a files=("$llvm"/bin/{FileCheck,not,count,lit} "$llvm/utils/lit"
    /usr/bin/orterun /usr/bin/orted /usr/bin/ompi-server "$ompi"
    /usr/share/openmpi /etc/openmpi)
  mapfile -t libs < <(library_closure "${elves[@]}")
  # Files keep their directory layout; libraries are copied under the
  # name ldd found them by (their soname), links followed.
  for f in "${files[@]}"; do
    mkdir -p "$stage/sys$(dirname "$f")"
    cp -a "$f" "$stage/sys$(dirname "$f")/"
  done
  for f in "${libs[@]}"; do
    mkdir -p "$stage/sys$(dirname "$f")"
    cp -L "$f" "$stage/sys$f"
  done
  mkdir -p "$stage/sys/usr/bin" && ln -sf orterun "$stage/sys/usr/bin/mpirun"
  echo "gpu_bundle: ${#libs[@]} libraries; compressing"
  tar -C "$stage" -cf - repo sys | xz -T0 -6 > "$BUNDLE"
  rm -rf "$stage"
  ls -la "$BUNDLE"
}

install() {
  [[ -f "$BUNDLE" ]] || { echo "gpu_bundle: $BUNDLE is missing (carry .gpu)" >&2; exit 1; }
  local tmp
  tmp=$(mktemp -d)
  xz -dc "$BUNDLE" | tar -C "$tmp" -xf -
  # System files: keep whatever the machine has.
  (cd "$tmp/sys" && tar -cf - .) | tar -C / --skip-old-files -xf -
  mkdir -p "$ROOT/build"
  cp -a "$tmp/repo/build/." "$ROOT/build/"
  rm -rf "$tmp"
  # The site configurations name the source tree they were made in.
  local src
  src=$(sed -n 's/^config.megac_src_root = "\(.*\)"$/\1/p' "$ROOT/build/test/lit.site.cfg.py")
  sed -i "s|$src|$ROOT|g" "$ROOT/build/test/lit.site.cfg.py" "$ROOT/build/test/Unit/lit.site.cfg.py"
  ldconfig 2>/dev/null || true
  echo "gpu_bundle: installed into $ROOT/build and /"
}

case "${1:-}" in
  pack) pack ;;
  install) install ;;
  *) echo "usage: $0 pack|install" >&2; exit 2 ;;
esac
