#!/usr/bin/env python3
"""CPU benchmark of one fp32 training step: megac's CPU backend beside
PyTorch on the same machine, in one run.

The model is the GPT-2 of bench/gpu_step.py (tied embeddings, pre-LN,
GeLU in its tanh form, AdamW, gradient clipping at 1.0), without dropout.
For each model and thread count T:

- PyTorch eager with torch.set_num_threads(T) (and torch.compile with
  --compile: inductor's C++ kernels, compiled in the run);
- megac: `megac compile --train` and `megac-run` with one OpenBLAS thread
  a rank, on T ranks (T = 1: one rank; T > 1: a dp=T grid under mpirun,
  the batch split between the ranks).

Tokens per second are the mean over --steps steps after 3 warm-up steps
(megac: the steps' own times from --metrics). Ratios between rows of one
run are what to compare; absolute numbers are those of the machine.

Needs PyTorch and numpy in the Python that runs it. PyTorch's wheels on
PyPI are large (about 3 GB with the CUDA libraries they pull in):

  python3 -m venv /tmp/torch-venv && /tmp/torch-venv/bin/pip install torch numpy
  /tmp/torch-venv/bin/python bench/cpu_step.py [--models demo,small]
      [--threads 1,2] [--steps 10] [--compile] [--megac-run-before PATH]
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_step  # noqa: E402  (the model definition, shared)

# name: (layers, hidden, heads, vocabulary, batch, sequence)
MODELS = {
    # The byte-level model of the demo and bench/train_throughput.sh.
    "demo": (4, 128, 4, 256, 16, 128),
    # Wider and longer: more of the step in products and attention.
    "small": (6, 384, 6, 4096, 8, 256),
}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def torch_tokens_per_s(torch, model, threads, steps, compiled):
    layers, hidden, heads, vocab, batch, seq = MODELS[model]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = gpu_step.build_model(
        torch, dict(n_layer=layers, n_embd=hidden, n_head=heads), seq, vocab)
    opt = torch.optim.AdamW(net.parameters(), lr=6e-4)
    run = torch.compile(net) if compiled else net
    idx = torch.randint(0, vocab, (batch, seq))
    labels = torch.randint(0, vocab, (batch, seq))

    def step():
        loss = run(idx, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * seq * steps / (time.perf_counter() - start)


def megac_tokens_per_s(bin_dir, tmp, model, ranks, steps, runner=None):
    layers, hidden, heads, vocab, batch, seq = MODELS[model]
    config = os.path.join(tmp, f"{model}.json")
    with open(config, "w") as f:
        json.dump(dict(n_layer=layers, n_embd=hidden, n_head=heads,
                       vocab_size=vocab, n_positions=seq), f)
    mlir, plan = os.path.join(tmp, f"{model}.mlir"), os.path.join(tmp, "p.mgc")
    data, metrics = os.path.join(tmp, "d.bin"), os.path.join(tmp, "m.jsonl")
    megac = os.path.join(bin_dir, "megac")
    subprocess.run([megac, "import", "--hf-config", config, "-o", mlir],
                   check=True)
    mesh = ["--mesh", f"dp={ranks}"] if ranks > 1 else []
    subprocess.run([megac, "compile", mlir, "--train", "--batch", str(batch),
                    "--seq", str(seq), *mesh, "-o", plan, "--quiet"],
                   check=True)
    import numpy as np
    np.random.default_rng(0).integers(0, vocab, 400000,
                                      dtype=np.uint16).tofile(data)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader")
    run = [runner or os.path.join(bin_dir, "megac-run"), plan, "--steps",
           str(steps + 3), "--data", data, "--metrics", metrics, "-q"]
    if ranks > 1:
        run = [shutil.which("mpirun") or "mpirun", "--oversubscribe", "-np",
               str(ranks), *run]
    subprocess.run(run, check=True, env=env)
    with open(metrics) as f:
        rates = [json.loads(line)["tokens_per_s"] for line in f][3:]
    return sum(rates) / len(rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,small")
    parser.add_argument("--threads", default="1,2",
                        help="thread counts: PyTorch's threads, megac's ranks")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile (inductor)")
    parser.add_argument("--megac-run-before", metavar="PATH",
                        help="also time this megac-run (an earlier build's, "
                        "on the same plan), for a before-and-after in one run")
    parser.add_argument("--megac-bin", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"))
    args = parser.parse_args()
    models = args.models.split(",")
    if set(models) - set(MODELS):
        parser.error(f"--models: {args.models}: " + ", ".join(MODELS))
    threads = [int(t) for t in args.threads.split(",")]
    try:
        import torch
    except ImportError:
        sys.exit("cpu_step.py: this Python has no PyTorch (see the top of "
                 "this file for how to install it)")
    print(f"Measured {datetime.date.today()} on {cpu_name()}, "
          f"{os.cpu_count()} cores (torch {torch.__version__}).")
    print("Command: python bench/cpu_step.py " + " ".join(sys.argv[1:]) + "\n")
    print("| model | layers x hidden, vocabulary, batch x seq | threads "
          "| runner | tokens/s | megac / runner |")
    print("|---|---|---:|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            layers, hidden, _, vocab, batch, seq = MODELS[model]
            shape = f"{layers} x {hidden}, {vocab}, {batch} x {seq}"
            for t in threads:
                rows = [("PyTorch eager", lambda: torch_tokens_per_s(
                    torch, model, t, args.steps, False))]
                if args.compile:
                    rows.append(("torch.compile", lambda: torch_tokens_per_s(
                        torch, model, t, args.steps, True)))
                ranks = f"{t} rank{'s' if t > 1 else ''}"
                if args.megac_run_before:
                    rows.append((f"megac, earlier megac-run ({ranks})",
                                 lambda: megac_tokens_per_s(
                                     args.megac_bin, tmp, model, t, args.steps,
                                     args.megac_run_before)))
                rows.append((f"megac ({ranks})",
                             lambda: megac_tokens_per_s(
                                 args.megac_bin, tmp, model, t, args.steps)))
                measured = []
                for name, measure in rows:
                    try:
                        measured.append((name, measure()))
                    except Exception as e:  # a row fails, the table stands
                        print(f"({name} failed: {e})", file=sys.stderr)
                        measured.append((name, None))
                megac = measured[-1][1]
                for name, rate in measured:
                    ratio = (f"{megac / rate:.2f}" if megac and rate
                             and name != measured[-1][0] else "")
                    shown = f"{rate:.0f}" if rate else "failed"
                    print(f"| {model} | {shape} | {t} | {name} | {shown} "
                          f"| {ratio} |", flush=True)


if __name__ == "__main__":
    main()
