"""Just enough of PyTorch for bench/gpu_step.py's ceilings, with made-up
times (no GPU): the tests drive its main loop with megac rows alone."""
import time

__version__ = "0.0-fake"
bfloat16, uint8 = "bfloat16", "uint8"


class _Tensor:
    def numel(self):
        return 1 << 30

    def __matmul__(self, other):
        return self

    def copy_(self, other):
        return self

    def t(self):
        return self


def randn(*shape, device=None, dtype=None):
    return _Tensor()


def empty(*shape, dtype=None, device=None):
    return _Tensor()


def empty_like(t):
    return _Tensor()


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_name():
        return "Fake GPU"

    @staticmethod
    def synchronize():
        time.sleep(0.001)  # (the ceilings' times are then never 0)
