"""Drives bench/gpu_step.py's order of rows and its time budget with a
made-up clock (no GPU, no PyTorch)."""
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import gpu_step  # noqa: E402

order = gpu_step.schedule(["350M", "1.3B"],
                          ["megac-tune", "eager", "compile", "megac", "megac-cudnn"])
print("order:", ", ".join(f"{m} {r}" for m, r in order))

now = [0.0]
sizes = {"350M": 300.0, "1.3B": 1200.0}
budget = gpu_step.Budget(100.0, sizes, clock=lambda: now[0])
print("nothing measured yet, 350M megac fits:", budget.fits("350M", "megac"))
now[0] = 10.0
budget.record("350M", "megac", 10.0)
budget.record("350M", "eager", 4.0)
# The same runner on a model four times the size: 10 s x sqrt(4).
print("1.3B megac expected:", budget.expected("1.3B", "megac"))
now[0] = 79.0
print("at 79 s, 1.3B megac fits:", budget.fits("1.3B", "megac"))
now[0] = 81.0
print("at 81 s, 1.3B megac fits:", budget.fits("1.3B", "megac"))
budget.record("1.3B", "megac", 50.0)
# A knob's first row: megac's family on its own model (not 1.3B's 50 s).
print("350M megac-tune expected:", budget.expected("350M", "megac-tune"))
# torch.compile's first row: PyTorch's family (eager's 4 s on 350M), scaled.
print("1.3B compile expected:", budget.expected("1.3B", "compile"))
# A smaller model's row is not scaled down.
budget.record("1.3B", "megac-cudnn", 30.0)
print("350M megac-cudnn expected:", budget.expected("350M", "megac-cudnn"))
print("no limit fits:", gpu_step.Budget(None, sizes).fits("1.3B", "megac"))
