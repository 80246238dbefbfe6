"""fusegrad.device: PyTorch's device object over fusegrad's device names.

`fusegrad.device("cpu")` is fusegrad's CPU device, `device("opencl")` its OPENCL device, `device("python")` the
numpy interpreter. PyTorch's other types (cuda, mps, xpu, ...) can be named, printed and compared; using one
(Tensor.to, tensor(device=...), Module.to) raises "CUDA is not available" naming fusegrad's devices, from
runtime/device.py's `canonical`, until fusegrad has such a device. Anywhere a device string is accepted a
device object is too: they read as their string ("cuda:0").
"""
from __future__ import annotations

# fusegrad's device names (runtime/device.py BACKENDS, lower case) and PyTorch's other device types
_FUSEGRAD = ("cpu", "opencl", "python")
_TORCH = ("cuda", "mps", "xpu", "hip", "xla", "meta", "mtia", "hpu", "ipu", "vulkan")


class device:
  """device("cpu"), device("cuda:0"), device("cuda", 0), device(0) (index 0 of the accelerator), or a copy of one; `.type`,
  `.index` (None when not given), str ("cuda:0"), ==, hash as PyTorch's. It also equals the strings that name
  it ("cpu", "CPU": a Tensor's `.device` is fusegrad's name as a string)."""
  __slots__ = ("type", "index")

  def __init__(self, type, index: int | None = None):   # noqa: A002 (PyTorch's parameter name)
    if isinstance(type, device): type, index = type.type, type.index if index is None else index
    elif isinstance(type, int) and not isinstance(type, bool):   # an index on the accelerator, as in PyTorch
      from fusegrad.accelerator import current_accelerator
      acc = current_accelerator()
      if acc is None: raise RuntimeError("Cannot access accelerator device when none is available.")
      type, index = acc.type, type
    if not isinstance(type, str): raise TypeError(f"device() expects a string, an int or a device, got {type!r}")
    name, sep, idx = type.strip().partition(":")
    name = name.lower()
    if name not in _FUSEGRAD + _TORCH:
      raise RuntimeError(f"Expected one of {', '.join(_FUSEGRAD + _TORCH)} device type at start of device string: "
                         f"{type}")
    if sep:
      if index is not None: raise RuntimeError(f"type (string) must not include an index because index was passed "
                                               f"explicitly: {type}")
      if not idx.isdigit(): raise RuntimeError(f"Invalid device string: {type!r}")
      index = int(idx)
    if index is not None:
      if isinstance(index, bool) or not isinstance(index, int): raise TypeError(f"device index must be an int, got {index!r}")
      if index < 0: raise RuntimeError(f"Device index must not be negative, got {index}")
    object.__setattr__(self, "type", name)
    object.__setattr__(self, "index", index)

  def __setattr__(self, k, v): raise AttributeError("fusegrad.device is immutable")
  def __str__(self) -> str: return self.type if self.index is None else f"{self.type}:{self.index}"
  def __repr__(self) -> str:
    return f"device(type='{self.type}')" if self.index is None else f"device(type='{self.type}', index={self.index})"
  def __hash__(self) -> int: return hash((self.type, self.index))

  def __eq__(self, other) -> bool:
    if isinstance(other, str):
      try:
        other = device(other)
      except (RuntimeError, TypeError):
        return False
    if not isinstance(other, device): return NotImplemented
    return (self.type, self.index) == (other.type, other.index)

  def __reduce__(self): raise TypeError("fusegrad does not pickle")
