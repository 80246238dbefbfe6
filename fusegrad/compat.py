"""PyTorch entry points that programs call around the model: compile, inference_mode, set_grad_enabled, matmul
precision, from_numpy. Each says in its docstring what it does in fusegrad, where that differs from PyTorch.
"""
from __future__ import annotations
import contextlib
import functools
import warnings
import numpy as np
from fusegrad import autograd
from fusegrad import dtype as dt
from fusegrad.graph import node as gn
from fusegrad.runtime import device as rd
from fusegrad.tensor import Tensor

__all__ = ["compile", "inference_mode", "set_grad_enabled", "set_float32_matmul_precision",
           "get_float32_matmul_precision", "from_numpy"]


def compile(model=None, *, fullgraph: bool = False, dynamic=None, backend="inductor", mode=None, options=None,
            disable: bool = False):   # noqa: A001 (PyTorch's name)
  """A no-op: returns `model` (a function or Module) itself, and works as `@compile` or `@compile(...)` too.

  fusegrad always compiles: every realize fuses the lazy graph into kernels, compiled once and cached. To also
  skip the Python that rebuilds a training step's graph each iteration, wrap the step in `fusegrad.jit`."""
  if model is None: return lambda m: m
  return model


class inference_mode(contextlib.ContextDecorator):
  """`with inference_mode():` / `@inference_mode()` / `@inference_mode`: no_grad (fusegrad has no separate
  inference tensors). `inference_mode(False)` leaves the grad mode as it is, as PyTorch's does."""

  def __new__(cls, mode=True):
    if callable(mode):   # used bare as a decorator
      return cls(True)(mode)
    return super().__new__(cls)

  def __init__(self, mode: bool = True): self.mode = bool(mode)
  def __enter__(self):
    self._prev = autograd.grad_enabled()
    if self.mode: autograd._state.enabled = False
    return self
  def __exit__(self, *exc):
    autograd._state.enabled = self._prev
    return False
  def clone(self) -> "inference_mode": return inference_mode(self.mode)
  def _recreate_cm(self): return self.clone()   # a decorated function that recurses keeps one saved mode per call


def is_inference_mode_enabled() -> bool: return not autograd.grad_enabled()


class set_grad_enabled(contextlib.ContextDecorator):
  """set_grad_enabled(False) switches gradients off now; as a context manager (`with set_grad_enabled(m):`)
  the previous mode comes back at the end, as in PyTorch."""

  def __init__(self, mode: bool):
    if not isinstance(mode, bool): raise TypeError(f"set_grad_enabled expects a bool, got {type(mode).__name__}")
    self.prev, self.mode = autograd.grad_enabled(), mode
    autograd._state.enabled = mode
  def __enter__(self):
    autograd._state.enabled = self.mode
    return self
  def __exit__(self, *exc):
    autograd._state.enabled = self.prev
    return False
  def __call__(self, fn):   # a decorator runs fn in the mode and restores the mode of the caller
    autograd._state.enabled = self.prev
    @functools.wraps(fn)
    def wrapped(*a, **k):
      with set_grad_enabled(self.mode): return fn(*a, **k)
    return wrapped


_matmul_precision = ["highest"]


def set_float32_matmul_precision(precision: str) -> None:
  """Accepted and recorded ("highest", "high", "medium"); fusegrad's float32 matmuls always accumulate in float32
  (there is no TF32 or bfloat16 shortcut), which is "highest"."""
  if precision not in ("highest", "high", "medium"):
    raise RuntimeError(f"Invalid precision {precision!r}: expected one of 'highest', 'high', 'medium'")
  _matmul_precision[0] = precision


def get_float32_matmul_precision() -> str: return _matmul_precision[0]


def from_numpy(ndarray: np.ndarray) -> Tensor:
  """A CPU tensor over a numpy array, sharing its memory where it can, as torch.from_numpy.

  Shared when the array is C-contiguous and its elements are aligned (numpy's `flags.aligned`): the tensor's
  buffer is the array's memory, so writes to the array are seen by the tensor. fusegrad is lazy: an op on the
  tensor reads the array when its result is computed (`.numpy()`, `.item()`, `.realize()`), not when the op is
  written; in-place ops on the tensor make new buffers (fusegrad's values are immutable), so the array never
  sees them, and kernels never write into it. The CPU device allocates on 64-byte boundaries for vector loads;
  numpy's arrays usually start on 16 bytes: shared arrays are read with unaligned loads, which is correct (the C
  kernels assume no alignment) and can be slower. Copied instead: non-contiguous arrays (fusegrad's buffers are
  dense; torch keeps the strides), misaligned elements, empty arrays. Like torch, other byte orders and dtypes
  fusegrad lacks are refused, and a read-only array gives a UserWarning (here the tensor only reads it)."""
  if not isinstance(ndarray, np.ndarray): raise TypeError(f"expected np.ndarray (got {type(ndarray).__name__})")
  a = ndarray
  if a.dtype.byteorder not in ("=", "|") and a.dtype.byteorder != np.dtype(a.dtype.char).byteorder:
    raise ValueError("given numpy array has byte order different from the native byte order. Conversion between "
                     "byte orders is currently not supported.")
  if a.dtype.kind not in "biuf":
    raise TypeError(f"can't convert np.ndarray of type {a.dtype}. The only supported types are: float64, float32, "
                    f"float16, int64, int32, int16, int8, uint8, uint32 and bool.")
  d = dt.from_numpy(a.dtype)   # a clear error for uint16, uint64, ...
  if not a.flags.writeable:
    warnings.warn("The given NumPy array is not writable; fusegrad shares its memory and only reads it (in-place "
                  "ops on the tensor make new buffers). Writing to the array changes the tensor's values; copy the "
                  "array to protect it.", UserWarning, stacklevel=2)
  dev = rd.get("CPU")
  if a.size and a.flags.c_contiguous and a.flags.aligned:
    buf = rd.ExternalBuffer(dev, a.size, d, a.reshape(-1).view(np.uint8), a)
  else:
    buf = rd.Buffer(dev, a.size, d)
    if a.size: buf.copyin(np.ascontiguousarray(a))
  return Tensor(_node=gn.buffer_node(buf, d, a.shape, "CPU"))
