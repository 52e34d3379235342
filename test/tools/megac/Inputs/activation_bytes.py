#!/usr/bin/env python3
"""Per-layer activation memory of a GPT layer from two `megac compile
--memory-report` outputs (L1 and L2 layers, everything else equal) against
Korthikanti et al. (2022), "Reducing Activation Recomputation in Large
Transformer Models", in fp16 bytes.

  activation_bytes.py --s S --b B --h H --t T [--recompute full] \
      REPORT_L1 L1 REPORT_L2 L2

The report's "activations kept for the backward pass (N B)" counts f32
bytes; the difference per layer cancels the embedding and the head, and
halving gives fp16 bytes. megac's attention is one fused op that recomputes
its probabilities in the backward pass (the paper's selective
recomputation: sbh (10 + 24/t)), and its dropout masks are recomputed from
counters instead of stored (the paper's 2 sbh of 1-byte masks), so the
expectation is sbh (8 + 24/t). With full recomputation the paper keeps only
each layer's input: 2 sbh. With sequence parallelism (and the backward
pass gathering the LayerNorm outputs again) everything is split over tp:
the paper's sbh (34/t), or 32/t without the masks.
"""
import argparse
import re
import sys


def kept_bytes(path):
    text = open(path).read()
    match = re.search(r"activations kept for the backward pass [^(]*\((\d+) B\)", text)
    if not match:
        sys.exit(f"{path}: no memory report")
    return int(match.group(1))


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
for name in ("s", "b", "h", "t"):
    parser.add_argument("--" + name, type=int, required=True)
parser.add_argument("--recompute", choices=["selective", "full"], default="selective")
parser.add_argument("--sequence-parallel", action="store_true",
                    help="TP+SP: the paper's sbh (34/t), masks excluded: 32/t")
parser.add_argument("reports", nargs=4)
args = parser.parse_args()
r1, l1, r2, l2 = args.reports[0], int(args.reports[1]), args.reports[2], int(args.reports[3])
per_layer_f32 = (kept_bytes(r2) - kept_bytes(r1)) / (l2 - l1)
fp16 = per_layer_f32 / 2
sbh = args.s * args.b * args.h
if args.recompute == "full":
    paper, formula = sbh * 2, "full recomputation 2sbh"
elif args.sequence_parallel:
    paper, formula = sbh * 32 / args.t, "TP+SP selective without masks sbh(32/t)"
else:
    paper, formula = sbh * (8 + 24 / args.t), "selective without masks sbh(8 + 24/t)"
ratio = fp16 / paper
print(f"t={args.t}: {fp16:.0f} fp16 bytes per layer = {fp16 / sbh:.2f} sbh; "
      f"Korthikanti {formula} = {paper:.0f}; ratio {ratio:.3f}")
sys.exit(0 if abs(ratio - 1) <= 0.10 else 1)
