"""dtypes and PyTorch's type-promotion rules.

A DType carries everything the rest of the stack asks about a type: its numpy twin, its size,
its category (bool < int < float) and the names the renderers spell it with.
"""
from __future__ import annotations
from dataclasses import dataclass
import builtins
import numpy as np


# eq=False: each dtype is one object (below), so == and hash are identity, in C: they run for every graph node built
# and every structural cache key; copies and unpickling hand back the same object (__reduce__)
@dataclass(frozen=True, eq=False)
class DType:
  name: str
  itemsize: int
  category: int          # 0 bool, 1 unsigned int, 2 signed int, 3 float
  np: type               # numpy scalar type used to hold the value on the host
  priority: int          # position in the promotion lattice inside a category

  def __repr__(self) -> str: return f"fusegrad.{self.name}"
  def __reduce__(self): return "bool_" if self.name == "bool" else self.name
  @property
  def is_float(self) -> bool: return self.category == 3
  @property
  def is_int(self) -> bool: return self.category in (1, 2)
  @property
  def is_unsigned(self) -> bool: return self.category == 1
  @property
  def is_bool(self) -> bool: return self.category == 0
  @property
  def is_signed(self) -> bool: return self.category in (2, 3)
  # torch.dtype's spellings of the categories (fusegrad has no complex types)
  @property
  def is_floating_point(self) -> bool: return self.category == 3
  @property
  def is_complex(self) -> bool: return False

  @property
  def min(self):
    if self.is_bool: return False
    if self.is_int: return builtins.int(np.iinfo(self.np).min)
    return -builtins.float("inf")

  @property
  def max(self):
    if self.is_bool: return True
    if self.is_int: return builtins.int(np.iinfo(self.np).max)
    return builtins.float("inf")


try:
  import ml_dtypes  # optional: numpy has no bfloat16 of its own
  _bf16_np = ml_dtypes.bfloat16
except ImportError:  # bfloat16 is stored as raw uint16 on the host then
  _bf16_np = np.uint16

bool_ = DType("bool", 1, 0, np.bool_, 0)
uint8 = DType("uint8", 1, 1, np.uint8, 1)
int8 = DType("int8", 1, 2, np.int8, 1)
int16 = DType("int16", 2, 2, np.int16, 2)
uint32 = DType("uint32", 4, 1, np.uint32, 3)   # internal (RNG); PyTorch has it with limited support
int32 = DType("int32", 4, 2, np.int32, 3)
int64 = DType("int64", 8, 2, np.int64, 4)
float16 = DType("float16", 2, 3, np.float16, 1)
bfloat16 = DType("bfloat16", 2, 3, _bf16_np, 1)
float32 = DType("float32", 4, 3, np.float32, 3)
float64 = DType("float64", 8, 3, np.float64, 4)

# the names PyTorch's kernels give dtypes in their messages ("bincount_cpu" not implemented for 'Float')
SCALAR_NAMES = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "uint32": "UInt32", "int32": "Int",
                "int64": "Long", "float16": "Half", "bfloat16": "BFloat16", "float32": "Float", "float64": "Double"}


def scalar_name(d: DType) -> str: return SCALAR_NAMES[d.name]


half, float, double = float16, float32, float64
short, int, long = int16, int32, int64
bool = bool_

ALL = (bool_, uint8, int8, int16, uint32, int32, int64, float16, bfloat16, float32, float64)
BY_NAME = {d.name: d for d in ALL}
default_float = float32
default_int = int64


def from_numpy(npdt) -> DType:
  npdt = np.dtype(npdt)
  for d in ALL:
    if d is bfloat16 and d.np is np.uint16: continue
    if np.dtype(d.np) == npdt: return d
  raise TypeError(f"numpy dtype {npdt} has no fusegrad equivalent")


def to_dtype(x) -> DType:
  """Accept a DType, a name ('float32'), a numpy dtype or a torch dtype."""
  if isinstance(x, DType): return x
  if isinstance(x, str):
    if x in BY_NAME: return BY_NAME[x]
    raise TypeError(f"unknown dtype {x!r}")
  name = str(x)
  if name.startswith("torch."): return to_dtype(name[6:])

  if x is builtins.float: return float64   # (torch: dtype=float is torch.float64, Python's float being a double)
  if x is builtins.int: return int64
  if x is builtins.bool: return bool_
  try:
    return from_numpy(x)
  except TypeError:
    raise TypeError(f"unknown dtype {x!r}") from None


def _promote2(a: DType, b: DType) -> DType:
  if a == b: return a
  if a.category == b.category: return a if a.priority > b.priority else b
  if a.is_float or b.is_float: return a if a.is_float else b
  if a.is_bool: return b
  if b.is_bool: return a
  # one unsigned, one signed int: the smallest signed type that holds both
  u, s = (a, b) if a.is_unsigned else (b, a)
  if s.itemsize > u.itemsize: return s
  for cand in (int16, int32, int64):
    if cand.itemsize > u.itemsize: return cand
  return int64


def promote_types(a: DType, b: DType) -> DType:
  """torch.promote_types."""
  if {a, b} == {float16, bfloat16}: return float32
  return _promote2(a, b)


def scalar_category(v) -> int:

  if isinstance(v, (builtins.bool, np.bool_)): return 0
  if isinstance(v, (builtins.int, np.integer)): return 2
  if isinstance(v, (builtins.float, np.floating)): return 3
  raise TypeError(f"unsupported scalar {v!r} of type {type(v).__name__}")


def result_type(*operands) -> DType:
  """torch.result_type over tensors and Python scalars: scalars only raise the category.

  Tensors are anything with a `.dtype` DType and `.ndim`; PyTorch treats 0-d tensors like
  scalars for promotion within a category, which we follow too.
  """
  dims = [o for o in operands if hasattr(o, "dtype") and o.ndim > 0]
  zeros = [o for o in operands if hasattr(o, "dtype") and o.ndim == 0]
  scalars = [o for o in operands if not hasattr(o, "dtype")]
  out = None
  for o in dims: out = o.dtype if out is None else promote_types(out, o.dtype)
  zd = None
  for o in zeros: zd = o.dtype if zd is None else promote_types(zd, o.dtype)
  if zd is not None:
    if out is None: out = zd
    elif zd.category > out.category and not (zd.category in (1, 2) and out.category in (1, 2)):
      out = zd
  for s in scalars:
    c = scalar_category(s)
    if out is None:
      out = {0: bool_, 2: default_int, 3: default_float}[c]
    elif c > out.category and not (c == 2 and out.category == 1):
      out = {0: bool_, 2: default_int, 3: default_float}[c]
  return out
