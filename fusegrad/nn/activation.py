"""The activations nn.functional and nn were missing: prelu (learnable slopes), rrelu (random slopes while training),
hardshrink, softshrink, tanhshrink, threshold, softsign, with their modules.

Each is a `where` over the input and a few elementwise ops, so it fuses into its neighbours and its gradient comes
from the autograd rules of those ops. Re-exported by nn.functional (the functions) and nn (the modules).
"""
from __future__ import annotations
import numpy as np
import fusegrad as fg
from fusegrad import dtype as dt
from fusegrad.tensor import Tensor, where
from fusegrad.nn.module import Module, Parameter
from fusegrad.nn import functional as F   # (the modules call F's traced functions; F imports this module last)

__all__ = ["prelu", "rrelu", "hardshrink", "softshrink", "tanhshrink", "threshold", "softsign"]


def prelu(input: Tensor, weight: Tensor) -> Tensor:
  """max(0, x) + weight * min(0, x), weight one slope or one per channel (dim 1), as torch's checks."""
  if input.dtype != weight.dtype:
    raise RuntimeError(f"prelu: Type promoting not supported. Got {dt.scalar_name(input.dtype)} and "
                       f"{dt.scalar_name(weight.dtype)}")
  n = weight.numel()
  if n != 1:
    if input.ndim == 0: raise RuntimeError("Not allow zero-dim input tensor.")
    channels = input.shape[1] if input.ndim > 1 else 1
    if channels != n:
      raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter numbers = {n} and "
                         f"channel size = {channels}.")
  if weight.ndim > 1:
    raise RuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim}")
  if input.ndim != weight.ndim:
    weight = weight.reshape(*[n if i == 1 else 1 for i in range(input.ndim)])
  return where(input > 0, input, weight * input)


def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
          inplace: bool = False) -> Tensor:
  """Training: each non-positive element times its own slope drawn from U(lower, upper); else the mean slope."""
  if not training: return where(input > 0, input, input * ((lower + upper) / 2))._cast(input.dtype)
  if lower > upper: raise RuntimeError("Lower bound should be less than or equal to the upper bound")
  slope = fg.rand(*input.shape, device=input.device) * (upper - lower) + lower
  return where(input > 0, input, input * slope._cast(input.dtype))._cast(input.dtype)


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
  # written as torch's kernel (zero inside [-lambd, lambd]) so a NaN passes through
  return where((input >= -lambd) & (input <= lambd), 0, input)._cast(input.dtype)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
  if input.dtype.is_float:
    mx = 3.3895313892515355e38 if input.dtype == dt.bfloat16 else float(np.finfo(input.dtype.np).max)
    if not 0 <= lambd <= mx:
      raise RuntimeError(f"lambda must be in range [0, {mx:g}] for input dtype {dt.scalar_name(input.dtype)}, but "
                         f"found {lambd:g}")
  shrunk = where(input > lambd, input - lambd, where(input < -lambd, input + lambd, input * 0))
  return where(input.isnan(), input, shrunk)._cast(input.dtype)


def tanhshrink(input: Tensor) -> Tensor: return input - input.tanh()


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
  """value where input <= threshold, else input (a NaN passes through, as torch's)."""
  return where(input <= threshold, value, input)._cast(input.dtype)


def softsign(input: Tensor) -> Tensor: return input / (input.abs() + 1)


# ---- modules ------------------------------------------------------------------------------------------------------

class PReLU(Module):
  def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None):
    super().__init__()
    self.num_parameters, self.init = num_parameters, init
    self.weight = Parameter(fg.zeros(num_parameters, device=device, dtype=dtype))
    self.reset_parameters()

  def reset_parameters(self) -> None:
    from fusegrad.nn import init
    init.constant_(self.weight, self.init)

  def forward(self, input: Tensor) -> Tensor: return F.prelu(input, self.weight)
  def extra_repr(self) -> str: return f"num_parameters={self.num_parameters}"


class RReLU(Module):
  def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
    super().__init__()
    self.lower, self.upper, self.inplace = lower, upper, inplace
  def forward(self, input: Tensor) -> Tensor: return F.rrelu(input, self.lower, self.upper, self.training)
  def extra_repr(self) -> str:
    return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")


class Hardshrink(Module):
  def __init__(self, lambd: float = 0.5):
    super().__init__()
    self.lambd = lambd
  def forward(self, input: Tensor) -> Tensor: return F.hardshrink(input, self.lambd)
  def extra_repr(self) -> str: return f"{self.lambd}"


class Softshrink(Module):
  def __init__(self, lambd: float = 0.5):
    super().__init__()
    self.lambd = lambd
  def forward(self, input: Tensor) -> Tensor: return F.softshrink(input, self.lambd)
  def extra_repr(self) -> str: return str(self.lambd)


class Threshold(Module):
  def __init__(self, threshold: float, value: float, inplace: bool = False):
    super().__init__()
    self.threshold, self.value, self.inplace = threshold, value, inplace
  def forward(self, input: Tensor) -> Tensor: return F.threshold(input, self.threshold, self.value)
  def extra_repr(self) -> str:
    return f"threshold={self.threshold}, value={self.value}" + (", inplace=True" if self.inplace else "")


class Softsign(Module):
  def forward(self, input: Tensor) -> Tensor: return F.softsign(input)


class Tanhshrink(Module):
  def forward(self, input: Tensor) -> Tensor: return F.tanhshrink(input)
