#!/usr/bin/env python3
"""gpt2_reference.py - check megac-run's GPT-2 logits against numpy.

Recomputes the GPT-2 forward pass (HuggingFace semantics) in float64 numpy
for the "tokens" stored in a megac-run --save-outputs file, and compares with
the file's "logits" (and "loss", when "labels" are present):

  gpt2_reference.py --weights W.safetensors --outputs OUT.safetensors \
      --n-head 4 [--eps 1e-5] [--tol 1e-4]

Prints the relative L2 error of each compared tensor; exits 1 if any is
above --tol. Logits wider than the checkpoint's vocabulary (a padded one)
must be 0 past it.
"""

import argparse
import math
import sys

import numpy as np

import safetensors_np
from script_io import run


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased, as torch
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(W, tokens, n_head, eps):
    B, S = tokens.shape
    x = W["wte.weight"][tokens] + W["wpe.weight"][:S][None]
    H = x.shape[-1]
    hd = H // n_head
    mask = np.tril(np.ones((S, S), bool))
    i = 0
    while f"h.{i}.ln_1.weight" in W:
        p = f"h.{i}."
        a = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = np.split(qkv, 3, axis=-1)
        heads = lambda t: t.reshape(B, S, n_head, hd).transpose(0, 2, 1, 3)
        q, k, v = heads(q), heads(k), heads(v)
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        s = np.where(mask, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(0, 2, 1, 3).reshape(B, S, H)
        x = x + o @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        m = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        f = gelu(m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + f @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
        i += 1
    x = layer_norm(x, W["ln_f.weight"], W["ln_f.bias"], eps)
    return x @ W["wte.weight"].T


def cross_entropy(logits, labels):
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
    picked = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    return float((lse - picked).mean())


def rel_err(got, ref):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    den = np.linalg.norm(ref.ravel())
    return float(np.linalg.norm((got - ref).ravel()) / (den if den else 1.0))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", required=True)
    p.add_argument("--outputs", required=True,
                   help="megac-run --save-outputs file")
    p.add_argument("--n-head", type=int, required=True)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()

    raw, _ = safetensors_np.load(a.weights)
    W = {}
    for k, v in raw.items():
        W[k[len("transformer."):] if k.startswith("transformer.") else k] = \
            v.astype(np.float64)
    outs, _ = safetensors_np.load(a.outputs)
    for need in ("tokens", "logits"):
        if need not in outs:
            sys.exit(f"gpt2_reference.py: error: {a.outputs} has no \"{need}\" tensor")
    logits = forward(W, outs["tokens"].astype(np.int64), a.n_head, a.eps)
    ok = True
    got = outs["logits"]
    V = logits.shape[-1]
    if got.shape[-1] > V:
        # A padded vocabulary (megac import --pad-vocab-to): the checkpoint's
        # V tokens first, then padding rows loaded as zeros, whose logits
        # are exactly 0.
        pad = got[..., V:]
        print(f"padding: {pad.shape[-1]} logits a token, largest magnitude "
              f"{float(np.abs(pad).max()):.3g}")
        ok &= bool(np.all(pad == 0))
        got = got[..., :V]
    e = rel_err(got, logits)
    print(f"logits {list(logits.shape)}: relative L2 error {e:.3e}")
    ok &= e <= a.tol
    if "labels" in outs and "loss" in outs:
        ref = cross_entropy(logits, outs["labels"].astype(np.int64))
        got = float(np.asarray(outs["loss"]).reshape(()))
        e = abs(got - ref) / max(abs(ref), 1e-30)
        print(f"loss: megac {got:.9g}, reference {ref:.9g}, relative error {e:.3e}")
        ok &= e <= a.tol
    if not ok:
        print(f"gpt2_reference.py: FAILED (tolerance {a.tol:g})")
        sys.exit(1)
    print("gpt2_reference.py: OK")


if __name__ == "__main__":
    run(main)
