"""Drives bench/gpu_step.py's table of step times over torch.compile's with
made-up times (no GPU, no PyTorch)."""
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import gpu_step  # noqa: E402

steps = {
    ("350M", "PyTorch eager"): 0.0652,
    ("350M", "torch.compile"): 0.0504,
    ("350M", "megac"): 0.0489,
    ("350M", "megac-tune"): None,  # failed
    ("1.3B", "megac"): 0.1374,  # no torch.compile row on this model
    ("124M", "torch.compile"): None,  # torch.compile failed
    ("124M", "megac"): 0.0200,
}
gpu_step.against_compile_table(steps)
print("--- nothing to compare:")
gpu_step.against_compile_table({("350M", "megac"): 0.0489})
print("--- end")
