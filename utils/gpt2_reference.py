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
from script_io import ScriptError, run


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased, as torch
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


LAYER_TENSORS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
                 "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                 "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias")


def num_layers(W):
    """The layers h.0 ... h.(n-1) the weights name, each with every tensor
    of a GPT-2 block: a missing one would otherwise end the model early
    and compare it with a shallower one."""
    indices = {int(k.split(".")[1]) for k in W
               if k.startswith("h.") and k.split(".")[1].isdigit()}
    n = max(indices) + 1 if indices else 0
    for i in range(n):
        for t in LAYER_TENSORS:
            if f"h.{i}.{t}" not in W:
                raise ScriptError(f"the weights have layers up to h.{n - 1} "
                                  f"but no h.{i}.{t}")
    for t in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
        if t not in W:
            raise ScriptError(f"the weights have no {t}")
    return n


def forward(W, tokens, n_head, eps):
    B, S = tokens.shape
    x = W["wte.weight"][tokens] + W["wpe.weight"][:S][None]
    H = x.shape[-1]
    hd = H // n_head
    mask = np.tril(np.ones((S, S), bool))
    for i in range(num_layers(W)):
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
    if a.n_head < 1:
        raise ScriptError(f"--n-head must be positive, got {a.n_head}")

    raw, _ = safetensors_np.load(a.weights)
    W = {}
    for k, v in raw.items():
        W[k[len("transformer."):] if k.startswith("transformer.") else k] = \
            v.astype(np.float64)
    outs, _ = safetensors_np.load(a.outputs)
    for need in ("tokens", "logits"):
        if need not in outs:
            raise ScriptError(f"{a.outputs} has no \"{need}\" tensor")
    tokens = outs["tokens"].astype(np.int64)
    vocab, hidden = W["wte.weight"].shape if "wte.weight" in W else (0, 0)
    if tokens.ndim != 2 or tokens.size == 0:
        raise ScriptError(f"{a.outputs}: tokens of shape {list(tokens.shape)}, "
                          "not [batch, seq]")
    if tokens.min() < 0 or tokens.max() >= vocab:
        raise ScriptError(f"{a.outputs}: tokens outside the weights' "
                          f"vocabulary [0, {vocab})")
    if "wpe.weight" in W and tokens.shape[1] > W["wpe.weight"].shape[0]:
        raise ScriptError(f"{a.outputs}: sequences of {tokens.shape[1]} tokens, "
                          f"more than the weights' {W['wpe.weight'].shape[0]} "
                          "positions")
    if "labels" in outs:
        labels = outs["labels"].astype(np.int64)
        if labels.shape != tokens.shape:
            raise ScriptError(f"{a.outputs}: labels of shape {list(labels.shape)} "
                              f"for tokens of shape {list(tokens.shape)}")
        if labels.min() < 0 or labels.max() >= vocab:
            raise ScriptError(f"{a.outputs}: labels outside the weights' "
                              f"vocabulary [0, {vocab})")
    if hidden % a.n_head:
        raise ScriptError(f"--n-head {a.n_head} does not divide n_embd {hidden}")
    logits = forward(W, tokens, a.n_head, a.eps)
    if outs["logits"].shape[:-1] != logits.shape[:-1]:
        raise ScriptError(f"{a.outputs}: logits of shape "
                          f"{list(outs['logits'].shape)} for tokens "
                          f"{list(tokens.shape)}")
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
