import os

import pytest
import torch

# Without CUDA, Triton's kernels (tlm.flash_attention) run in its interpreter, which
# triton.jit chooses when it wraps them, at `import tlm`: before any test module imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class RecordCalls(torch.overrides.TorchFunctionMode):
    """While active, records every torch function called (including torch.nn.functional)."""

    def __init__(self):
        super().__init__()
        self.called = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.called.append(func)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def record_calls():
    return RecordCalls
