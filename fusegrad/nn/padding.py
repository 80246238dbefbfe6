"""The padding modules (ZeroPad, ConstantPad, ReflectionPad, ReplicationPad, CircularPad in 1d/2d/3d): torch's
arguments, `padding` tuples and reprs over nn.functional.pad, which checks the input's dims and pad sizes."""
from __future__ import annotations
from collections.abc import Iterable
from fusegrad.tensor import Tensor
from fusegrad.nn import functional as F
from fusegrad.nn.module import Module


def _ntuple(x, n: int) -> tuple:
  # torch's _ntuple: an iterable is kept as given (a wrong length is F.pad's error), a number repeated
  return tuple(x) if isinstance(x, Iterable) else (x,) * n


class _PadNd(Module):
  _mode = "constant"
  _nd = 0
  def __init__(self, padding):
    super().__init__()
    self.padding = _ntuple(padding, 2 * self._nd)
  def forward(self, input: Tensor) -> Tensor: return F.pad(input, self.padding, self._mode)
  def extra_repr(self) -> str: return f"{self.padding}"


class _ConstantPadNd(_PadNd):
  def __init__(self, padding, value: float):
    super().__init__(padding)
    self.value = value
  def forward(self, input: Tensor) -> Tensor: return F.pad(input, self.padding, "constant", self.value)
  def extra_repr(self) -> str: return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd): _nd = 1
class ConstantPad2d(_ConstantPadNd): _nd = 2
class ConstantPad3d(_ConstantPadNd): _nd = 3


class _ZeroPadNd(_ConstantPadNd):
  def __init__(self, padding): super().__init__(padding, 0.0)
  def extra_repr(self) -> str: return f"{self.padding}"


class ZeroPad1d(_ZeroPadNd, ConstantPad1d): pass
class ZeroPad2d(_ZeroPadNd, ConstantPad2d): pass
class ZeroPad3d(_ZeroPadNd, ConstantPad3d): pass


class _ReflectionPadNd(_PadNd): _mode = "reflect"
class ReflectionPad1d(_ReflectionPadNd): _nd = 1
class ReflectionPad2d(_ReflectionPadNd): _nd = 2
class ReflectionPad3d(_ReflectionPadNd): _nd = 3


class _ReplicationPadNd(_PadNd): _mode = "replicate"
class ReplicationPad1d(_ReplicationPadNd): _nd = 1
class ReplicationPad2d(_ReplicationPadNd): _nd = 2
class ReplicationPad3d(_ReplicationPadNd): _nd = 3


class _CircularPadNd(_PadNd):
  """torch's CircularPad modules check the input's dims themselves (ValueError), the others leave it to F.pad."""
  _mode = "circular"
  def forward(self, input: Tensor) -> Tensor:
    if input.ndim not in (self._nd + 1, self._nd + 2):
      raise ValueError(f"expected {self._nd + 1}D or {self._nd + 2}D input (got {input.ndim}D input)")
    return super().forward(input)


class CircularPad1d(_CircularPadNd): _nd = 1
class CircularPad2d(_CircularPadNd): _nd = 2
class CircularPad3d(_CircularPadNd): _nd = 3
