"""Runtime sizes: a dimension whose size is a kernel argument, so one compiled program serves every size.

A `Variable` names a bounded integer (a sequence length, a KV cache's filled length); `v.bind(n)` gives a
`BoundDim`, an int of value n that remembers its Variable. Slicing with it (`cache[:, :v.bind(n)]`,
`narrow(d, 0, v.bind(n))`, `arange(v.bind(n))`) makes a tensor with that dim in its shape, and the dim travels
through the ops that keep it (elementwise ops, reductions over other dims, permutes, expands, reshapes that keep
it whole). Everything above the kernels sees the int n; lowering (codegen/lower.py) turns such a dim's loop into
one over the Variable's upper bound, guarded by `i < n` where n is a kernel argument (ir.Kernel.params), and a
sequential loop over it ends at n at run time (ir.Axis.end). A buffer that holds such a dim is laid out with the
dim at its upper bound (its storage), so the strides of the kernels that write and read it do not depend on n.

Arithmetic on a BoundDim gives a plain int: a size derived from one (n * 64, n - 1) is an ordinary size, which
the kernels see as a constant -- correct, compiled per value. What keys a kernel (the schedule's structure keys,
the hash-consing of nodes) records a bound dim's Variable beside its value (`tags`), so a graph laid out with
bound dims never shares a schedule with an isomorphic one without them.
"""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np

# set once any Variable is bound in this process: until then no shape holds a BoundDim, and the keys skip the walk
bound_any = [False]


@dataclass(frozen=True)
class Variable:
  """A named integer in [lo, hi] (lo >= 1) that sizes a dimension at run time."""
  name: str
  lo: int
  hi: int

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name.isidentifier():
      raise ValueError(f"Variable: the name must be an identifier, got {self.name!r}")
    if not (isinstance(self.lo, int) and isinstance(self.hi, int)) or not 1 <= self.lo <= self.hi:
      raise ValueError(f"Variable {self.name}: needs integer bounds 1 <= lo <= hi, got [{self.lo}, {self.hi}]")

  def bind(self, value) -> "BoundDim":
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
      raise TypeError(f"Variable {self.name}: binds an integer, got {type(value).__name__}")
    if not self.lo <= int(value) <= self.hi:
      raise ValueError(f"Variable {self.name}: {int(value)} is outside its bounds [{self.lo}, {self.hi}]")
    bound_any[0] = True
    return BoundDim(int(value), self)


class BoundDim(int):
  """An int that is the value of a Variable (a dimension sized at run time); arithmetic gives plain ints."""
  def __new__(cls, value: int, var: Variable):
    self = super().__new__(cls, value)
    self.var = var
    return self

  def __repr__(self): return int.__repr__(self)
  def __reduce__(self): return (BoundDim, (int(self), self.var))


def is_bound(d) -> bool: return type(d) is BoundDim


def tags(shape) -> tuple:
  """The bound dims of a shape as (position, Variable) pairs: () when there are none (the common case)."""
  if not bound_any[0]: return ()
  return tuple((i, d.var) for i, d in enumerate(shape) if type(d) is BoundDim)


def storage_shape(shape) -> tuple:
  """The shape of the buffer that holds a value of this shape: bound dims at their Variable's upper bound."""
  if not bound_any[0]: return tuple(shape)
  return tuple(d.var.hi if type(d) is BoundDim else d for d in shape)


def storage_numel(shape) -> int:
  n = 1
  for d in storage_shape(shape): n *= d
  return n


def from_storage(flat: np.ndarray, shape) -> np.ndarray:
  """A buffer's elements (flat, in storage layout) as an array of the logical shape."""
  st = storage_shape(shape)
  arr = flat.reshape(st)
  if st == tuple(shape): return arr
  return np.ascontiguousarray(arr[tuple(slice(0, int(d)) for d in shape)])


def merge(nodes) -> tuple:
  """The one shape of an elementwise op's sources, with a runtime size wherever one of them has it there."""
  shape = list(nodes[0].shape)
  for n in nodes[1:]:
    for i, d in tags(n.shape): shape[i] = n.shape[i]
  return tuple(shape)


def shape_key(shape) -> tuple:
  """A shape as a kernel's cache key sees it: a runtime size by its Variable, not its value."""
  return tuple(d.var if type(d) is BoundDim else d for d in shape)


def values(shape) -> tuple:
  """The values of a shape's runtime sizes."""
  return tuple(int(d) for d in shape if type(d) is BoundDim)


def dim_key(shape) -> tuple:
  """A shape as a name part: bound dims by their Variable's name."""
  return tuple(d.var.name if type(d) is BoundDim else int(d) for d in shape)
