#!/usr/bin/env python3
"""Checks compiled gradients against central finite differences of the loss.

Runs a gradient plan (`megac compile --gradients`) once with a HuggingFace
GPT-2 checkpoint, then, for each checked parameter tensor, perturbs it along
its unit gradient direction d = g/|g| by +-eps and reruns the plan: the
directional derivative (L(w + eps d) - L(w - eps d)) / (2 eps) must equal
|g|. Using the gradient's own direction gives the largest derivative the
tensor has, so fp32 rounding of the loss stays small against it.

  check_gradients.py --plan P.mgc --weights W.safetensors --n-embd 128 \
      [--params NAME ...] [--eps 0.05] [--tol 0.02] [--megac-run PATH] \
      [--launcher "mpirun -np 2"]

A plan for several ranks runs under --launcher (its words precede
megac-run), so the partitioned backward pass (the vocabulary-parallel
cross-entropy, say) is checked the same way.
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

DEFAULT_PARAMS = [
    "wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
    "h.0.attn.q.weight", "h.0.attn.k.weight", "h.0.attn.v.bias",
    "h.1.attn.c_proj.weight", "h.1.mlp.c_fc.weight", "h.1.mlp.c_fc.bias",
    "h.1.mlp.c_proj.bias", "ln_f.weight",
]


def hf_location(name, hidden):
    """HF tensor and slice holding megac parameter `name` (q/k/v are
    column slices of GPT-2's fused c_attn)."""
    for i, part in enumerate("qkv"):
        for kind in ("weight", "bias"):
            suffix = f".attn.{part}.{kind}"
            if name.endswith(suffix):
                hf = name[: -len(suffix)] + f".attn.c_attn.{kind}"
                return hf, (Ellipsis, slice(i * hidden, (i + 1) * hidden))
    return name, (Ellipsis,)


def run_loss(megac_run, plan, weights, out):
    subprocess.run(megac_run + [plan, "--weights", weights, "--save-outputs", out, "-q"],
                   check=True)
    tensors, _ = safetensors_np.load(out)
    return tensors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--n-embd", type=int, required=True)
    parser.add_argument("--params", nargs="*", default=DEFAULT_PARAMS)
    parser.add_argument("--eps", type=float, default=0.05)
    parser.add_argument("--tol", type=float, default=0.02)
    parser.add_argument("--megac-run", default="megac-run")
    parser.add_argument("--launcher", default="",
                        help="command words that start megac-run on the plan's ranks")
    args = parser.parse_args()
    megac_run = shlex.split(args.launcher) + [args.megac_run]

    weights, meta = safetensors_np.load(args.weights)
    with tempfile.TemporaryDirectory() as tmp:
        base = run_loss(megac_run, args.plan, args.weights,
                        os.path.join(tmp, "base.st"))
        worst = 0.0
        for name in args.params:
            grad = base.get("grad:" + name)
            if grad is None:
                sys.exit(f"check_gradients.py: the plan has no output grad:{name}")
            grad = grad.astype(np.float64)
            norm = float(np.linalg.norm(grad))
            direction = grad / norm
            hf, index = hf_location(name, args.n_embd)
            losses = []
            for sign in (+1, -1):
                perturbed = dict(weights)
                tensor = weights[hf].astype(np.float64).copy()
                tensor[index] += sign * args.eps * direction
                perturbed[hf] = tensor.astype(np.float32)
                path = os.path.join(tmp, "w.st")
                safetensors_np.save(path, perturbed)
                out = run_loss(megac_run, args.plan, path, os.path.join(tmp, "o.st"))
                losses.append(float(out["loss"]))
            fd = (losses[0] - losses[1]) / (2 * args.eps)
            err = abs(fd - norm) / norm
            worst = max(worst, err)
            print(f"{name}: |g| {norm:.6e}  finite difference {fd:.6e}  relative error {err:.2e}")
    print(f"worst relative error {worst:.2e} (tolerance {args.tol})")
    if worst > args.tol:
        sys.exit(1)
    print("check_gradients.py: OK")


if __name__ == "__main__":
    main()
