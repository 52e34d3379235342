#!/usr/bin/env python3
"""GPU benchmark of one training step (issue #5): GPT-2 124M, 350M and a
1.3B-shaped model (tp=1, bf16), side by side in one run on one GPU:

- PyTorch eager and torch.compile (the peers), tokens/s and MFU;
- megac (`megac compile --train --precision bf16 --target cuda`, then
  `megac-run --backend cuda`);
- the ceilings measured in the same run: a large bf16 GEMM (cuBLAS through
  torch.matmul) and device-to-device copy bandwidth;
- megac's time per op (`megac-run --profile`, device events, from a second
  run: the step time comes from one without the profile) against those
  ceilings: FLOP/s for products and attention, bytes/s for the rest.

Prints a markdown table with the date, the device and the command, for
docs/performance.md. Needs a CUDA GPU and PyTorch (the device image has
both); run it on the machine the `device` tool lends:

  python3 bench/gpu_step.py [--models 124M,350M,1.3B] [--batch 8] [--seq 1024]
                            [--runners eager,compile,megac]

(`--runners megac` skips PyTorch, whose torch.compile takes most of the
run, for quick turns on megac's own kernels; `megac-wmma` adds megac with
its earlier wmma attention kernels, MEGAC_CUDA_ATTENTION=wmma, to compare
the two attentions side by side; `megac-nocopy` adds megac without its
bf16 operand copies, MEGAC_CUDA_BF16_COPIES=0, every product packing its
operands as before them; `megac-fp32` adds megac with its bf16 copies
but every buffer in fp32, MEGAC_CUDA_BF16_ONLY=0, none kept in bf16
alone; `megac-cudnn` adds megac with cuDNN's fused attention asked for
by name, MEGAC_CUDA_ATTENTION=cudnn (the default, auto, takes it where
libcudnn.so.9 loads); `megac-mma` adds megac with its own
register-resident attention kernels instead, MEGAC_CUDA_ATTENTION=mma;
`megac-refwd` adds megac with its attention gradients running the
forward again for the row statistics, MEGAC_CUDA_FORWARD_STATS=0;
`megac-noepi` adds megac with its bf16 GEMM groups run as a product and
megac's epilogue kernel instead of cuBLASLt's epilogues,
MEGAC_CUDA_EPILOGUES=0, and `megac-epi` with cuBLASLt's epilogues
wherever it has them, MEGAC_CUDA_EPILOGUES=1 (by default megac times
both ways for each product shape at its first use and keeps the faster;
the benchmark prints each shape's two times, "+c" where the group adds a
residual); `megac-sepdq` adds megac with each attention's dq from a
kernel of its own instead of summed with atomics in dk and dv's pass,
MEGAC_CUDA_DQ_ATOMICS=0; `megac-noparam` adds megac rounding its
weights at each step's start instead of taking the bits the previous
step's AdamW wrote, MEGAC_CUDA_PARAM_COPIES=0; `megac-tune` adds megac
timing the algorithms cuBLASLt offers for each product shape and keeping
the fastest, MEGAC_CUDA_GEMM_TUNE=1; `megac-narrow` adds megac with its
attention forward in blocks of 64 queries, 16 a warp, instead of 128, 32
a warp, MEGAC_CUDA_WIDE_FORWARD=0; `megac-narrowkg` adds megac with its
attention's key-gradient pass in blocks of 64 keys instead of 128 at
head sizes up to 64, MEGAC_CUDA_WIDE_KEY_GRAD=0; `megac-align64` adds
megac telling cuBLASLt's heuristic its pointers are 64-byte aligned, as
it did before the arena's alignment became 256, MEGAC_CUDA_LT_ALIGN=64;
`megac-anyred` adds megac letting cuBLASLt's heuristic offer algorithms
that split k with any reduction and cuBLAS's plain bf16 products reduce
in reduced precision (PyTorch's default), MEGAC_CUDA_LT_REDUCTIONS=any;
`megac-nobgrad` adds megac with its bias gradients from column sums
instead of cuBLASLt's BGRAD epilogues, the others kept,
MEGAC_CUDA_BGRAD_EPILOGUE=0; `megac-cudnnfast` adds megac with cuDNN's
attention backward as cuDNN and PyTorch run it by default instead of its
deterministic plan, MEGAC_CUDA_CUDNN_DETERMINISTIC=0; `megac-probe` adds
megac timing each bf16 product shape, at its first use, also without
its epilogue, with a bf16 result where it writes fp32, and with its
operands in the other storage orders, MEGAC_CUDA_GEMM_PROBE=1: its table
sets those times beside PyTorch's product of the same shape and storage
orders, to tell what makes a shape slower than the ceiling.)

MFU = model FLOPs per step / step time / the measured GEMM ceiling, with
model FLOPs per token 6 N + 12 L H S (N parameters without the position
table, L layers, H hidden, S sequence), as nanoGPT and the PaLM paper
count them.
"""
import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CONFIGS = {
    "124M": dict(n_layer=12, n_embd=768, n_head=12),
    "350M": dict(n_layer=24, n_embd=1024, n_head=16),
    "1.3B": dict(n_layer=24, n_embd=2048, n_head=16),
}
VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64, as nanoGPT


def build_model(torch, cfg, seq, vocab=VOCAB):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, h, heads):
            super().__init__()
            self.ln_1 = nn.LayerNorm(h)
            self.c_attn = nn.Linear(h, 3 * h)
            self.c_proj = nn.Linear(h, h)
            self.ln_2 = nn.LayerNorm(h)
            self.c_fc = nn.Linear(h, 4 * h)
            self.mlp_proj = nn.Linear(4 * h, h)
            self.heads = heads

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
            q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
                       for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(b, s, h))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            h = cfg["n_embd"]
            self.wte = nn.Embedding(vocab, h)
            self.wpe = nn.Embedding(seq, h)
            self.blocks = nn.ModuleList(Block(h, cfg["n_head"]) for _ in range(cfg["n_layer"]))
            self.ln_f = nn.LayerNorm(h)

        def forward(self, idx, labels):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer
            return F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))

    return GPT()


def parameter_count(cfg):
    """Parameters without the position table, as torch_row counts them: the
    tied embedding, per block two LayerNorms, q/k/v, the projection and the
    MLP with their biases (12 h^2 + 13 h), and the last LayerNorm."""
    h, layers = cfg["n_embd"], cfg["n_layer"]
    return VOCAB * h + layers * (12 * h * h + 13 * h) + 2 * h


def time_steps(torch, step, steps, warmup=3):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def torch_kernels(torch, step, steps=2):
    r"""Milliseconds a step of each CUDA kernel \p step launches, from
    torch.profiler over \p steps steps (after the timed ones, so warm)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ms = {}
    for event in prof.key_averages():
        us = (getattr(event, "self_device_time_total", 0)
              or getattr(event, "device_time_total", 0)
              or getattr(event, "cuda_time_total", 0))
        if us:
            ms[event.key] = ms.get(event.key, 0.0) + us / 1e3 / steps
    return ms


def torch_row(torch, name, cfg, args, compiled):
    torch.manual_seed(0)
    model = build_model(torch, cfg, args.seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    run = torch.compile(model) if compiled else model
    idx = torch.randint(0, VOCAB, (args.batch, args.seq), device="cuda")
    labels = torch.randint(0, VOCAB, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(idx, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sec = time_steps(torch, step, args.steps)
    kernels = None
    if compiled and args.kernels:
        try:
            kernels = torch_kernels(torch, step)
        except Exception as e:  # the table is extra: the row stands without
            print(f"(torch.profiler failed for {name}: {e})", file=sys.stderr)
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    del model, opt
    torch.cuda.empty_cache()
    return sec, n, kernels


def gemm_ceiling(torch, size=8192, reps=20):
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    sec = time_steps(torch, lambda: a @ b, reps)
    return 2 * size ** 3 / sec


def copy_bandwidth(torch, gib=2, reps=20):
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    sec = time_steps(torch, lambda: dst.copy_(src), reps)
    return 2 * src.numel() / sec  # read + write


# megac's runners: the environment each runs megac-run with. The knobs of
# megac's own attention kernels run them (MEGAC_CUDA_ATTENTION=mma): by
# default cuDNN's takes the attention, and the knob would change nothing;
# compare those rows with megac-mma's.
MEGAC_RUNNERS = {
    "megac": {},
    "megac-wmma": {"MEGAC_CUDA_ATTENTION": "wmma"},
    "megac-cudnn": {"MEGAC_CUDA_ATTENTION": "cudnn"},
    "megac-mma": {"MEGAC_CUDA_ATTENTION": "mma"},
    "megac-nocopy": {"MEGAC_CUDA_BF16_COPIES": "0"},
    "megac-fp32": {"MEGAC_CUDA_BF16_ONLY": "0"},
    "megac-refwd": {"MEGAC_CUDA_FORWARD_STATS": "0"},
    "megac-noepi": {"MEGAC_CUDA_EPILOGUES": "0"},
    "megac-epi": {"MEGAC_CUDA_EPILOGUES": "1"},
    "megac-sepdq": {"MEGAC_CUDA_DQ_ATOMICS": "0", "MEGAC_CUDA_ATTENTION": "mma"},
    "megac-noparam": {"MEGAC_CUDA_PARAM_COPIES": "0"},
    "megac-tune": {"MEGAC_CUDA_GEMM_TUNE": "1"},
    "megac-narrow": {"MEGAC_CUDA_WIDE_FORWARD": "0", "MEGAC_CUDA_ATTENTION": "mma"},
    "megac-narrowkg": {"MEGAC_CUDA_WIDE_KEY_GRAD": "0", "MEGAC_CUDA_ATTENTION": "mma"},
    "megac-align64": {"MEGAC_CUDA_LT_ALIGN": "64"},
    "megac-anyred": {"MEGAC_CUDA_LT_REDUCTIONS": "any"},
    "megac-nobgrad": {"MEGAC_CUDA_BGRAD_EPILOGUE": "0"},
    "megac-cudnnfast": {"MEGAC_CUDA_CUDNN_DETERMINISTIC": "0"},
    "megac-probe": {"MEGAC_CUDA_GEMM_PROBE": "1"},
}


def compile_megac(cfg, args, tmp):
    r"""megac's plan of one training step of \p cfg in \p tmp (every megac
    runner of a model runs the same plan: the knobs are the runtime's)."""
    megac = os.path.join(args.megac_bin, "megac")
    config = os.path.join(tmp, "c.json")
    with open(config, "w") as f:
        f.write('{"n_layer": %d, "n_embd": %d, "n_head": %d, "vocab_size": %d, '
                '"n_positions": %d}' % (cfg["n_layer"], cfg["n_embd"], cfg["n_head"],
                                        VOCAB, args.seq))
    model, plan = os.path.join(tmp, "m.mlir"), os.path.join(tmp, "p.mgc")
    subprocess.run([megac, "import", "--hf-config", config, "-o", model], check=True)
    subprocess.run([megac, "compile", model, "--train", "--precision", "bf16",
                    "--target", "cuda", "--batch", str(args.batch), "--seq",
                    str(args.seq), "-o", plan, "--quiet"], check=True)
    return plan


def megac_row(plan, args, knobs, profiled):
    r"""Seconds per step of megac's CUDA backend on \p plan (run with the
    environment \p knobs adds), or why there is none; its time per op
    where \p profiled, with the algorithm cuBLASLt's heuristic chose for
    each product shape (MEGAC_CUDA_LT_LOG=1 in the profiled run); each
    product shape's two times, with cuBLASLt's epilogue and plain, where
    megac timed them (MEGAC_CUDA_EPILOGUES=timed, the default, logged with
    MEGAC_CUDA_LT_LOG=1 at the first step of the timed run); and the
    host's milliseconds a step issuing the instructions and then waiting
    for the device (megac-run's log), which say whether CUDA graphs could
    pay."""
    run = os.path.join(args.megac_bin, "megac-run")
    tmp = os.path.dirname(plan)
    metrics = os.path.join(tmp, "m.jsonl")
    profile = os.path.join(tmp, "profile.json")
    env = dict(os.environ, **knobs)
    # The step time from a run without --profile (whose device events
    # around every instruction cost host time), the time per op from a
    # second run with it.
    host, rates, choices, timed, probed = None, None, [], [], []
    for extra in ([], ["--profile", profile, "-q"]) if profiled else ([],):
        # (The log's lines come at the first step, while products are
        # planned: they cost the timed steps nothing.)
        out = subprocess.run([run, plan, "--backend", "cuda", "--steps",
                              str(args.steps + 3), "--metrics", metrics]
                             + extra, capture_output=True, text=True,
                             env=dict(env, MEGAC_CUDA_LT_LOG="1"))
        if out.returncode != 0:
            return None, (out.stderr.strip().splitlines()[-1]
                          if out.stderr else "failed"), None, None, ([], [], [])
        if extra:
            choices = LT_CHOICE.findall(out.stderr)
        if not extra:
            timed = EPILOGUE_TIMED.findall(out.stderr)
            probed = [parse_probe(m) for m in GEMM_PROBE.finditer(out.stderr)]
            rates = [json.loads(line)["tokens_per_s"]
                     for line in open(metrics)][3:]
            found = re.search(r"host issued a step's instructions in "
                              r"([0-9.]+) ms, then waited ([0-9.]+) ms",
                              out.stdout + out.stderr)
            host = (float(found.group(1)), float(found.group(2))) if found else None
    ops = None
    if profiled:
        with open(profile) as f:
            prof = json.load(f)
        # The steps the profile sums: the CUDA backend's leaves out its
        # first (kernels loaded, products planned and timed).
        ops = (prof["ops"], prof.get("steps", args.steps + 3))
    return (args.batch * args.seq / (sum(rates) / len(rates)), "", ops, host,
            (choices, timed, probed))


# megac-run's line for a cuBLASLt product shape (MEGAC_CUDA_LT_LOG=1).
LT_CHOICE = re.compile(
    r"megac-run: cuBLASLt (\d+x\d+x\d+ \w\w) (\w+->\w+) (\w+): algo (-?\d+) "
    r"tile (-?\d+) stages (-?\d+) split-k (-?\d+) reduction (-?\d+) swizzle (-?\d+) "
    r"custom (-?\d+) waves ([0-9.]+) workspace (\d+)")


# megac-run's line for a product shape whose two ways it timed
# (MEGAC_CUDA_EPILOGUES=timed with MEGAC_CUDA_LT_LOG=1).
EPILOGUE_TIMED = re.compile(
    r"megac-run: epilogue timed (\d+x\d+x\d+) ([\w+]+): epilogue ([0-9.]+) ms, "
    r"plain ([0-9.]+) ms: (\w+)")


# megac-run's line for a product shape it probed (MEGAC_CUDA_GEMM_PROBE=1):
# the milliseconds a call as it runs, then in other ways ("-": none).
GEMM_PROBE = re.compile(
    r"megac-run: gemm probe (\d+)x(\d+)x(\d+) ([NT][NT]) (\w+->\w+) ([\w+]+): (.*)")


def parse_probe(match):
    """((m, n, k), ops, types, epilogue, [(way, ms or None)]) of a
    GEMM_PROBE line."""
    m, n, k, ops, types, epi, ways = match.groups()
    parsed = []
    for part in ways.split(", "):
        way, ms = part.rsplit(" ", 1)
        parsed.append((way, None if ms == "-" else float(ms)))
    return (int(m), int(n), int(k)), ops, types, epi, parsed


def torch_product_ms(torch, m, n, k, ops, reps=20):
    r"""Milliseconds a call of PyTorch's bf16 product of column-major
    D[m, n] = op(A) op(B) over k, \p ops ("NT": A as stored, B
    transposed), as cuBLAS gets it: row-major D^T[n, m] = op(B)^T op(A)^T,
    each operand a view of its storage that tells PyTorch the op."""
    def operand(rows, cols, transposed):
        # (rows x cols as the product reads it; stored the other way round
        # where transposed.)
        if transposed:
            return torch.randn(cols, rows, device="cuda", dtype=torch.bfloat16).t()
        return torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    # op(B)^T is [n, k]: B stored column-major k x n (row-major [n, k])
    # when op(B) = N; op(A)^T is [k, m] likewise.
    bt = operand(n, k, ops[1] == "T")
    at = operand(k, m, ops[0] == "T")
    return time_steps(torch, lambda: bt @ at, reps) * 1e3


def probe_table(name, probed, peak, torch):
    """Each probed product shape: megac's milliseconds a call as it runs
    and in the ways it does not, each with its share of the GEMM ceiling,
    beside PyTorch's product of the same shape in each storage order (bf16
    result, no epilogue)."""
    print(f"\nGEMM probe, {name} (MEGAC_CUDA_GEMM_PROBE=1; column-major m x n x k; "
          "ms a call, (share of the ceiling); torch: PyTorch's product):\n")
    print("| product | ops | types | epilogue | megac: ways | torch: NN, NT, TN, TT |")
    print("|---|---|---|---|---|---|")
    for (m, n, k), ops, types, epi, ways in probed:
        flops = 2.0 * m * n * k
        def cell(ms):
            return "-" if ms is None else f"{ms:.4f} ({flops / (ms * 1e-3) / peak:.2f})"
        own = "; ".join(f"{way} {cell(ms)}" for way, ms in ways)
        theirs = ", ".join(cell(torch_product_ms(torch, m, n, k, o))
                           for o in ("NN", "NT", "TN", "TT"))
        print(f"| {m}x{n}x{k} | {ops} | {types} | {epi} | {own} | {theirs} |")


def timed_table(name, timed):
    """Each product shape's call with cuBLASLt's epilogue and plain (the
    product, then megac's kernels), as megac timed them at its first use,
    and the way it kept."""
    print(f"\nEpilogue or plain, timed at first use, {name} (column-major "
          "m x n x k; ms a call):\n")
    print("| product | epilogue | with epilogue | plain | kept |")
    print("|---|---|---:|---:|---|")
    for shape, epi, with_ms, plain_ms, kept in timed:
        print(f"| {shape} | {epi} | {with_ms} | {plain_ms} | {kept} |")


def choices_table(name, choices):
    """The algorithm cuBLASLt's heuristic chose for each product shape
    (tile and stages as cublasLt.h numbers cublasLtMatmulTile_t and
    cublasLtMatmulStages_t)."""
    print(f"\ncuBLASLt's choices, {name} (column-major m x n x k, op(A) op(B); "
          "MEGAC_CUDA_LT_LOG=1):\n")
    print("| product | types | epilogue | algo | tile | stages | split-k | "
          "reduction | swizzle | custom | waves | workspace |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in choices:
        print("| " + " | ".join(c) + " |")


# The rows every model gets before any model gets another: the peers and
# megac as it runs by default. The knobs' runners come after, so that a
# run cut short by its time limit still has the comparison the issue asks
# for on every model.
CORE_RUNNERS = ("eager", "compile", "megac")


def schedule(models, runners):
    """(model, runner) pairs in the order they run: the core runners of
    every model, then the others of every model, each in the order given."""
    core = [r for r in runners if r in CORE_RUNNERS]
    rest = [r for r in runners if r not in CORE_RUNNERS]
    return ([(m, r) for m in models for r in core] +
            [(m, r) for m in models for r in rest])


class Budget:
    r"""Seconds a run may take in all (None: no limit). A row starts only
    where the time left exceeds what it is expected to take:
    - the longest the same runner took on a model;
    - else the longest a runner of its family (PyTorch's, or megac's) took
      on the same model (a knob's row reuses the model's plan);
    - else the longest its family took on another model;
    each scaled up where it ran on a smaller model, by the square root of
    the models' sizes (\p sizes: model -> parameters): much of a row is
    fixed costs that follow the layer count (torch.compile's compilation,
    megac's plan, the weights' initialisation), which the benchmark's
    350M and 1.3B share, and not the width. Rows printed before a time
    limit are then whole, and the time goes to the rows that fit. (Scaled
    by the sizes themselves and taking a larger model's megac row for a
    smaller model's knob, the H100 run of 2026-11-26 left out three rows
    it had the time for.)"""

    def __init__(self, seconds, sizes, clock=time.monotonic):
        self.clock, self.start = clock, clock()
        self.seconds, self.sizes = seconds, sizes
        self.taken = {}  # (model, runner) -> seconds

    def left(self):
        return None if self.seconds is None else self.seconds - (self.clock() - self.start)

    def expected(self, model, runner):
        def scaled(rows):
            return [s * math.sqrt(max(1.0, self.sizes[model] / self.sizes[m]))
                    for (m, _), s in rows]
        def family(key):
            return key[1].startswith("megac") == runner.startswith("megac")
        same = scaled((k, s) for k, s in self.taken.items() if k[1] == runner)
        here = [s for k, s in self.taken.items() if k[0] == model and family(k)]
        elsewhere = scaled((k, s) for k, s in self.taken.items() if family(k))
        return max(same or here or elsewhere or [0.0])

    def fits(self, model, runner):
        left = self.left()
        return left is None or left > self.expected(model, runner)

    def record(self, model, runner, seconds):
        self.taken[(model, runner)] = seconds


# Ops whose time is bound by arithmetic (the rest by memory traffic).
COMPUTE_OPS = {"linear", "linear_bias", "linear_weight_grad", "matmul",
               "attention", "attention_grad"}


def against_compile(steps):
    r"""Each measured row's step time over torch.compile's on the same model
    in the same run (below 1: faster than torch.compile), for the models
    that have a torch.compile row. \p steps: {(model, runner label):
    seconds, or None where the row failed}, in the order measured. Returns
    (model, label, ms, ratio) rows, torch.compile's own left out."""
    rows = []
    for (model, label), sec in steps.items():
        peer = steps.get((model, "torch.compile"))
        if sec is None or not peer or label == "torch.compile":
            continue
        rows.append((model, label, sec * 1e3, sec / peer))
    return rows


def against_compile_table(steps):
    rows = against_compile(steps)
    if not rows:
        return
    print("\nStep time over torch.compile's on the same model, this run "
          "(below 1: faster than torch.compile):\n")
    print("| model | runner | step ms | / torch.compile |")
    print("|---|---|---:|---:|")
    for model, label, ms, ratio in rows:
        print(f"| {model} | {label} | {ms:.1f} | {ratio:.3f} |")


def kernel_table(name, ops, steps, peak, bandwidth, limit=12):
    r"""megac's time per op over its \p steps profiled steps against the
    ceilings measured in this run."""
    print(f"\nmegac per op, {name} (`megac-run --profile` over {steps} steps; "
          "ceilings from this run):\n")
    print("| op | runs | ms | ms a step | share | achieved | of ceiling |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for op in ops[:limit]:
        if op["op"] in COMPUTE_OPS:
            got, of = f'{op["flops_per_s"] / 1e12:.1f} TFLOP/s', op["flops_per_s"] / peak
        else:
            got, of = f'{op["bytes_per_s"] / 1e9:.0f} GB/s', op["bytes_per_s"] / bandwidth
        print(f'| {op["op"]} | {op["runs"]} | {op["ms"]:.1f} | {op["ms"] / steps:.2f} | '
              f'{op["share"]:.3f} | {got} | {of:.3f} |')


CATEGORIES = ("attention", "GEMM", "optimizer", "other (memory-bound)")


def torch_category(kernel):
    """The category of a CUDA kernel by its name: FlashAttention's and
    cuDNN's attention kernels, cuBLAS's and CUTLASS's products, the fused
    AdamW, and the rest (Triton's fused kernels, norms, copies)."""
    n = kernel.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "xmma", "nvjet", "cutlass", "cublas",
                            "splitk")):
        return "GEMM"
    if "adam" in n:
        return "optimizer"
    return CATEGORIES[3]


def megac_category(op):
    """The category of one of megac's ops (megac-run --profile)."""
    if op in ("attention", "attention_grad"):
        return "attention"
    if op in COMPUTE_OPS or op == "linear_gelu_grad":
        return "GEMM"
    if op == "adam_w":
        return "optimizer"
    return CATEGORIES[3]


def category_table(name, torch_ms, megac_ops, megac_steps, limit=12):
    r"""torch.compile's and megac's milliseconds a step by category, side
    by side (megac's over its \p megac_steps profiled steps), then
    torch.compile's costliest kernels; returns the rows."""
    rows = []
    for cat in CATEGORIES:
        t = sum(ms for k, ms in torch_ms.items() if torch_category(k) == cat)
        m = (sum(o["ms"] for o in megac_ops if megac_category(o["op"]) == cat)
             / megac_steps if megac_ops else None)
        rows.append((cat, t, m))
    print(f"\ntorch.compile and megac by kind of kernel, {name} (ms a step: "
          f"torch.profiler over 2 steps; `megac-run --profile` over "
          f"{megac_steps}):\n")
    print("| kind | torch.compile ms | megac ms | megac / torch.compile |")
    print("|---|---:|---:|---:|")
    for cat, t, m in rows:
        ratio = f"{m / t:.2f}" if m is not None and t > 0 else "-"
        shown = f"{m:.2f}" if m is not None else "-"
        print(f"| {cat} | {t:.2f} | {shown} | {ratio} |")
    print(f"\ntorch.compile's costliest kernels, {name}:\n")
    print("| kernel | kind | ms a step |")
    print("|---|---|---:|")
    for k, ms in sorted(torch_ms.items(), key=lambda kv: -kv[1])[:limit]:
        short = k if len(k) <= 80 else k[:77] + "..."
        print(f"| `{short}` | {torch_category(k)} | {ms:.2f} |")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="124M,350M,1.3B")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runners", default="eager,compile,megac",
                        help="which rows to measure, in this order (each "
                        "model's eager, compile and megac rows before any "
                        "model's other rows): eager, compile, "
                        + ", ".join(MEGAC_RUNNERS) + " (the megac runners "
                        "with a knob are described at the top of this "
                        "file); the ceilings are measured always")
    parser.add_argument("--profile-runners", default="megac",
                        help="the megac runners that also run with "
                        "megac-run --profile for the per-op tables (a "
                        "second run each)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds the whole run may take: a row that "
                        "would not fit in the time left, judged by the "
                        "rows before it, is left out and named at the end")
    parser.add_argument("--no-kernels", dest="kernels", action="store_false",
                        help="skip torch.profiler's kernel table of the "
                        "torch.compile rows (compared with megac's by kind)")
    parser.add_argument("--megac-bin", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"))
    args = parser.parse_args()
    runners = args.runners.split(",")
    if set(runners) - {"eager", "compile"} - set(MEGAC_RUNNERS):
        parser.error(f"--runners: {args.runners}: eager, compile, "
                     + ", ".join(MEGAC_RUNNERS))
    profiled = set(args.profile_runners.split(",")) if args.profile_runners else set()
    if profiled - set(MEGAC_RUNNERS):
        parser.error(f"--profile-runners: {args.profile_runners}: "
                     + ", ".join(MEGAC_RUNNERS))
    models = args.models.split(",")
    if set(models) - set(CONFIGS):
        parser.error(f"--models: {args.models}: " + ", ".join(CONFIGS))
    sizes = {name: parameter_count(CONFIGS[name]) for name in models}
    budget = Budget(args.budget_s, sizes)
    import torch
    if not torch.cuda.is_available():
        sys.exit("gpu_step.py: no CUDA device")
    device = torch.cuda.get_device_name()
    peak = gemm_ceiling(torch)
    bandwidth = copy_bandwidth(torch)
    print(f"Measured {datetime.date.today()} on {device} (torch {torch.__version__}).")
    print(f"Command: python3 bench/gpu_step.py --models {args.models} --batch "
          f"{args.batch} --seq {args.seq} --steps {args.steps} --runners "
          f"{args.runners} --profile-runners {args.profile_runners}"
          + (f" --budget-s {args.budget_s:.0f}" if args.budget_s else ""))
    print(f"Ceilings in this run: bf16 GEMM 8192^3 {peak / 1e12:.0f} TFLOP/s, "
          f"device copy {bandwidth / 1e9:.0f} GB/s.\n")
    print("| model | params | runner | step ms | tokens/s | MFU (of the GEMM ceiling) |")
    print("|---|---:|---|---:|---:|---:|")
    tokens = args.batch * args.seq
    profiles, hosts, torch_kernels_of, megac_ops_of, skipped = [], [], {}, {}, []
    steps = {}  # (model, label) -> seconds a step (None: failed)
    lt_choices, epilogue_timings, probes = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        plans = {}
        for name, key in schedule(models, runners):
            cfg, n = CONFIGS[name], sizes[name]
            if not budget.fits(name, key):
                skipped.append(f"{name} {key}")
                continue
            began = time.monotonic()
            why, ops, host = "", None, None
            if key in ("eager", "compile"):
                sec, counted, kernels = torch_row(torch, name, cfg, args,
                                                  key == "compile")
                assert counted == n, f"{name}: {counted} parameters, not {n}"
                label = "PyTorch eager" if key == "eager" else "torch.compile"
                if kernels:
                    torch_kernels_of[name] = kernels
            else:
                label = key
                if not (os.path.exists(os.path.join(args.megac_bin, "megac")) and
                        os.path.exists(os.path.join(args.megac_bin, "megac-run"))):
                    sec, why = None, f"no megac build at {args.megac_bin}"
                else:
                    if name not in plans:
                        os.makedirs(os.path.join(tmp, name))
                        plans[name] = compile_megac(cfg, args, os.path.join(tmp, name))
                    sec, why, ops, host, (lt, timed, probed) = megac_row(
                        plans[name], args, MEGAC_RUNNERS[key], key in profiled)
                    if lt:
                        lt_choices.append((f"{name} ({key})", lt))
                    if timed:
                        epilogue_timings.append((f"{name} ({key})", timed))
                    if probed:
                        probes.append((f"{name} ({key})", probed))
                if ops:
                    profiles.append((f"{name} ({key})",) + ops)
                    if key == "megac":
                        megac_ops_of[name] = ops
                if host:
                    hosts.append((f"{name} ({key})", host))
            budget.record(name, key, time.monotonic() - began)
            flops = tokens * (6 * n + 12 * cfg["n_layer"] * cfg["n_embd"] * args.seq)
            steps[(name, label)] = sec
            if sec is None:
                print(f"| {name} | {n / 1e6:.0f}M | {label} | - | - | - ({why}) |", flush=True)
            else:
                print(f"| {name} | {n / 1e6:.0f}M | {label} | {sec * 1e3:.1f} | "
                      f"{tokens / sec:.0f} | {flops / sec / peak:.3f} |", flush=True)
    against_compile_table(steps)
    if skipped:
        print(f"\nNot run, for the time limit (--budget-s {args.budget_s:.0f}): "
              + ", ".join(skipped) + ".")
    # What each row took, for sizing the next run's --budget-s and rows.
    if budget.taken:
        print("\nSeconds each row took (compilation and profiles included): "
              + ", ".join(f"{m} {r} {t:.0f}" for (m, r), t in budget.taken.items())
              + ".")
    if hosts:
        print("\nmegac's host a step after the first (megac-run's log): "
              "issuing the instructions, then waiting for the device\n")
        print("| run | issue ms | wait ms |")
        print("|---|---:|---:|")
        for name, (issue, wait) in hosts:
            print(f"| {name} | {issue:.2f} | {wait:.2f} |")
    for name, ops, steps in profiles:
        kernel_table(name, ops, steps, peak, bandwidth)
    for name, lt in lt_choices:
        choices_table(name, lt)
    for name, timed in epilogue_timings:
        timed_table(name, timed)
    for name, probed in probes:
        probe_table(name, probed, peak, torch)
    for name in models:
        if name in torch_kernels_of and name in megac_ops_of:
            category_table(name, torch_kernels_of[name], *megac_ops_of[name])


if __name__ == "__main__":
    main()
