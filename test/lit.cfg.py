# lit configuration for megac's FileCheck, diagnostic and end-to-end tests.
import os
import shutil
import subprocess
import sys

import lit.formats

config.name = "megac"
config.test_format = lit.formats.ShTest(not lit_config.isWindows)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Unit"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.megac_obj_root, "test")

config.environment["FILECHECK_OPTS"] = "-enable-var-scope --dump-input=fail"
# Open MPI refuses to run as root without these; CI runs as root.
config.environment["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
config.environment["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
config.environment["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
# Keep Open MPI off the network: shared memory and loopback only.
config.environment["OMPI_MCA_btl"] = "self,vader"
config.environment["OMPI_MCA_btl_tcp_if_include"] = "lo"
config.environment["OMPI_MCA_oob_tcp_if_include"] = "lo"
config.environment["OPENBLAS_NUM_THREADS"] = "1"
for var in ["HOME", "TMPDIR"]:
    if var in os.environ:
        config.environment[var] = os.environ[var]
# The compiled-kernel cache of `megac compile --target cuda`: one of the
# run's own, empty at its start, so that every kernel the tests generate
# is compiled by NVRTC at least once a run (and ~/.cache stays as it was).
kernel_cache = os.path.join(config.test_exec_root, "kernel-cache")
shutil.rmtree(kernel_cache, ignore_errors=True)
config.environment["MEGAC_KERNEL_CACHE"] = kernel_cache
# Open MPI parameters the caller sets (say plm=isolated where no ssh is).
for var in os.environ:
    if var.startswith("OMPI_MCA_"):
        config.environment[var] = os.environ[var]

config.environment["PATH"] = os.pathsep.join(
    [config.megac_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])])

# MEGAC_TEST_PYTHON names another Python (one with numpy, on a machine
# whose system Python has none).
python = os.environ.get("MEGAC_TEST_PYTHON") or (
    "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
config.substitutions.append(("%python", python))
config.substitutions.append(("%utils", os.path.join(config.megac_src_root, "utils")))
config.substitutions.append(("%megac_src", config.megac_src_root))
config.substitutions.append(("%mlir_tblgen", config.mlir_tblgen))
config.substitutions.append(("%mlir_include", config.mlir_include_dir))
mpirun = shutil.which("mpirun")
if mpirun:
    config.available_features.add("mpi")
    config.substitutions.append(("%mpirun", mpirun + " --oversubscribe -np"))

# PyTorch's own torchrun (torchrun-real.test), where torch is installed.
if mpirun and shutil.which("torchrun") and shutil.which("ompi-server"):
    config.available_features.add("torchrun")

if subprocess.run([python, "-c", "import numpy"], capture_output=True).returncode == 0:
    config.available_features.add("numpy")

# File leases (leased-files.test): Linux with fs.leases-enable on, and a
# file system that grants them where the tests write.
_lease_probe = """
import fcntl, os, sys, tempfile
fd, path = tempfile.mkstemp(dir=sys.argv[1])
try:
    fcntl.fcntl(fd, getattr(fcntl, "F_SETLEASE", 1024), fcntl.F_WRLCK)
finally:
    os.close(fd)
    os.unlink(path)
"""
if subprocess.run([python, "-c", _lease_probe, config.test_exec_root],
                  capture_output=True).returncode == 0:
    config.available_features.add("leases")

# flock(2) where the tests write, and util-linux's flock(1)
# (train-checkpoint-lock.test): a file system that keeps such locks.
_flock_probe = """
import fcntl, os, sys, tempfile
fd, path = tempfile.mkstemp(dir=sys.argv[1])
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
finally:
    os.close(fd)
    os.unlink(path)
"""
if shutil.which("flock") and subprocess.run(
        [python, "-c", _flock_probe, config.test_exec_root],
        capture_output=True).returncode == 0:
    config.available_features.add("flock")

# Two cores or more for this process (train-blas-threads.test: OpenBLAS
# takes no more threads than cores).
if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2:
    config.available_features.add("cores2")

# Root, with setpriv to run a test's command as another user (nobody).
if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv"):
    config.available_features.add("other-user")

# Network namespaces and hostnames of one's own (torchrun-two-hosts.test
# runs ranks on two "hosts" of this machine): root, ip netns, unshare.
_netns_probe = "megac-probe-%d" % os.getpid()
if shutil.which("ip") and shutil.which("unshare") and subprocess.run(
        ["ip", "netns", "add", _netns_probe], capture_output=True).returncode == 0:
    if subprocess.run(["ip", "netns", "exec", _netns_probe, "unshare", "--uts",
                       "hostname", "probe"], capture_output=True).returncode == 0 \
            and subprocess.run(["ip", "-n", _netns_probe, "link", "add", "probea",
                                "type", "veth", "peer", "name", "probeb"],
                               capture_output=True).returncode == 0:
        config.available_features.add("netns")
    subprocess.run(["ip", "netns", "del", _netns_probe], capture_output=True)

# megac compile --target cuda needs NVRTC at build time (no GPU).
if getattr(config, "megac_have_nvrtc", False):
    config.available_features.add("nvrtc")
# megac-run's CUDA backend plugin is built (where the CUDA toolkit is).
if getattr(config, "megac_have_cuda_backend", False):
    config.available_features.add("cuda-backend")

# GPU tests run only where a CUDA device answers.
nvidia_smi = shutil.which("nvidia-smi")
if nvidia_smi and subprocess.run([nvidia_smi, "-L"], capture_output=True).returncode == 0:
    config.available_features.add("cuda")
    # The first GPU's compute capability, as "cuda-sm90": tests of what a
    # plan's per-architecture binaries do on one (cuda-ptx.test: compute_90
    # PTX runs on 9.x alone, below it an sm_80 cubin is taken instead, and
    # past it the PTX is taken for want of a cubin, not for the knob).
    cap = subprocess.run([nvidia_smi, "--query-gpu=compute_cap",
                          "--format=csv,noheader"], capture_output=True,
                         text=True)
    if cap.returncode == 0 and cap.stdout.strip():
        config.available_features.add(
            "cuda-sm" + cap.stdout.split()[0].replace(".", ""))

# The CUDA backend's source on the host emulation of CUDA (always built):
# `%cuda_emu megac-run ... --backend cuda` runs it without a GPU. Tests of
# one rank use `%cuda_backend` instead: the real backend where a GPU and
# the plugin are, else the emulation (a GPU runs one rank; the multi-rank
# tests stay on the emulation). On a GPU those tests run megac's own
# attention kernels (MEGAC_CUDA_ATTENTION=mma), whose variants they
# compare, and not cuDNN's, which the backend takes by default where it
# loads and which cuda-cudnn.test checks; the emulation has no cuDNN.
# Both take cuBLASLt's epilogues wherever it has them
# (MEGAC_CUDA_EPILOGUES=1) instead of timing them against the plain
# products at each shape's first use, the default, whose choice follows
# the clock: the tests count the epilogue products and compare runs bit for
# bit. cuda-epilogue-timing.test tests the timed choice.
pinned = "MEGAC_CUDA_EPILOGUES=1"
cuda_emu = "env " + pinned + " MEGAC_CUDA_PLUGIN=" + os.path.join(config.megac_tools_dir, "libmegac_cuda_emu.so")
config.substitutions.append(("%cuda_emu", cuda_emu))
on_gpu = "cuda" in config.available_features and "cuda-backend" in config.available_features
config.substitutions.append(("%cuda_backend", "env MEGAC_CUDA_ATTENTION=mma " + pinned if on_gpu else cuda_emu))

# The built-in training corpus (scripts/setup.sh installs jargon-text).
jargon = "/usr/share/doc/jargon-text/jargon.txt.gz"
if os.path.exists(jargon):
    config.available_features.add("jargon")
    config.substitutions.append(("%jargon", jargon))

if shutil.which(config.mlir_tblgen, path=config.environment["PATH"]):
    config.available_features.add("mlir-tblgen")
if shutil.which("mlir-opt", path=config.llvm_tools_dir):
    config.available_features.add("mlir-opt")
