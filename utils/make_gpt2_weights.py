#!/usr/bin/env python3
"""make_gpt2_weights.py - write a random GPT-2 checkpoint with HF tensor names.

The file looks like a HuggingFace GPT2Model safetensors export (Conv1D
layouts, c_attn fused as [H, 3H], the "h.{i}.attn.bias" causal-mask buffer)
so megac-run's --weights path and gpt2_reference.py can be tested without
downloading anything. Biases and layer-norm parameters are deliberately
non-trivial so that every bias path is exercised.

  make_gpt2_weights.py -o w.safetensors --n-layer 2 --n-embd 64 --n-head 4 \
      --vocab 128 --n-positions 64 --seed 0 [--prefix transformer.]
"""

import argparse
import sys

import numpy as np

import safetensors_np
from script_io import ScriptError, check_output, run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--n-positions", type=int, default=64)
    p.add_argument("--n-inner", type=int, default=0,
                   help="the MLP's width (default: 4 x n-embd, as HF's n_inner: null)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.02)
    p.add_argument("--prefix", default="",
                   help='prefix for every name, e.g. "transformer."')
    p.add_argument("--dtype", choices=["F32", "F16"], default="F32")
    a = p.parse_args()
    for name in ("n_layer", "n_embd", "n_head", "vocab", "n_positions"):
        if getattr(a, name) < 1:
            raise ScriptError(f"--{name.replace('_', '-')} must be positive, "
                              f"got {getattr(a, name)}")
    if a.n_inner < 0 or a.seed < 0:
        raise ScriptError("--n-inner and --seed must be 0 or more")
    if not (np.isfinite(a.std) and a.std > 0):
        raise ScriptError(f"--std must be a positive number, got {a.std}")
    if a.n_embd % a.n_head:
        raise ScriptError("--n-head must divide --n-embd")
    check_output(a.output, "-o")

    rng = np.random.default_rng(a.seed)
    H, V, P = a.n_embd, a.vocab, a.n_positions
    F = a.n_inner or 4 * H

    def normal(*shape, std=a.std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"wte.weight": normal(V, H), "wpe.weight": normal(P, H, std=0.01)}
    for i in range(a.n_layer):
        q = f"h.{i}."
        t[q + "ln_1.weight"] = 1 + normal(H, std=0.1)
        t[q + "ln_1.bias"] = normal(H, std=0.05)
        t[q + "attn.bias"] = np.tril(np.ones((P, P), np.float32)).reshape(1, 1, P, P)
        t[q + "attn.c_attn.weight"] = normal(H, 3 * H)
        t[q + "attn.c_attn.bias"] = normal(3 * H, std=0.05)
        t[q + "attn.c_proj.weight"] = normal(H, H)
        t[q + "attn.c_proj.bias"] = normal(H, std=0.05)
        t[q + "ln_2.weight"] = 1 + normal(H, std=0.1)
        t[q + "ln_2.bias"] = normal(H, std=0.05)
        t[q + "mlp.c_fc.weight"] = normal(H, F)
        t[q + "mlp.c_fc.bias"] = normal(F, std=0.05)
        t[q + "mlp.c_proj.weight"] = normal(F, H)
        t[q + "mlp.c_proj.bias"] = normal(H, std=0.05)
    t["ln_f.weight"] = 1 + normal(H, std=0.1)
    t["ln_f.bias"] = normal(H, std=0.05)
    if a.dtype == "F16":
        t = {k: v.astype(np.float16) for k, v in t.items()}
    t = {a.prefix + k: v for k, v in t.items()}
    safetensors_np.save(a.output, t, {"format": "pt"})
    n = sum(v.size for k, v in t.items() if not k.endswith("attn.bias"))
    print(f"make_gpt2_weights.py: wrote {a.output} ({n} parameters)")


if __name__ == "__main__":
    run(main)
