"""fusegrad.cuda: PyTorch's CUDA queries, answered truthfully. fusegrad has no CUDA device yet, so
is_available() is False and device_count() 0; seeding and synchronizing are accepted and do nothing (there is no
CUDA generator or stream: fusegrad's one generator, `fusegrad.manual_seed`, serves every device). Asking for a
CUDA tensor (`.to("cuda")`, `.cuda()`) raises "CUDA is not available" naming fusegrad's devices.
"""
from __future__ import annotations
from fusegrad.runtime import device as _rd


def is_available() -> bool: return "CUDA" in _rd.BACKENDS
def device_count() -> int: return 1 if is_available() else 0
def is_bf16_supported(including_emulation: bool = True) -> bool: return False
def manual_seed(seed: int) -> None: """Accepted; there is no CUDA generator to seed."""
def manual_seed_all(seed: int) -> None: """Accepted; there is no CUDA generator to seed."""
def synchronize(device=None) -> None: """Accepted; there is no CUDA stream to wait for."""
def empty_cache() -> None: """Accepted; no CUDA memory is held."""


def current_device() -> int:
  raise RuntimeError(f"CUDA is not available: fusegrad has no CUDA device; fusegrad's devices are "
                     f"{', '.join(_rd.BACKENDS)}")


from fusegrad import amp  # noqa: E402,F401  (torch.cuda.amp.GradScaler and autocast; the same objects as fusegrad.amp)
