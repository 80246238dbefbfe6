"""Tensor: PyTorch's names and semantics over a lazy graph.

Every method checks its arguments (raising the exception PyTorch would, naming shapes, dtypes and
axes) and then records graph nodes (graph/node.py); nothing runs until a value is asked for. Ops
PyTorch composes from primitives are composed here the same way, so the kernels see only the
primitive table of graph/ops.py.
"""
from __future__ import annotations
import builtins
import copy
import functools
import math
from collections import namedtuple
from typing import Sequence
import numpy as np
from fusegrad import dtype as dt
from fusegrad.dtype import DType
from fusegrad.graph import node as gn
from fusegrad.graph.node import Node
from fusegrad.graph.view import prod
from fusegrad.graph.dims import BoundDim, from_storage, storage_shape
from fusegrad.runtime import device as rd
from fusegrad import autograd
from fusegrad import alias
from fusegrad.engine import jit as _jit, trace as _trace
from fusegrad.templates import templated

_DETACH = (("DETACH", None),)
ReturnMinMax = namedtuple("return_types", ["values", "indices"])


HALF_FLOATS = (dt.float16, dt.bfloat16)


def _float32_inside(fn):
  """A float16/bfloat16 input is computed in float32 and the result rounded once, as PyTorch's kernel for
  this op does (its opmath type is float32); composed of several fusegrad ops it would round after each."""
  @functools.wraps(fn)
  def wrapper(self, *args, **kwargs):
    if self.dtype not in HALF_FLOATS: return fn(self, *args, **kwargs)
    out = fn(self._cast(dt.float32), *args, **kwargs)
    back = lambda o: o._cast(self.dtype) if isinstance(o, Tensor) and o.dtype == dt.float32 else o
    return tuple(back(o) for o in out) if isinstance(out, tuple) else back(out)
  return wrapper


# ---- argument checking --------------------------------------------------------------------------------

def _norm_dim(dim: int, ndim: int) -> int:
  if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
    raise TypeError(f"dim must be an int, got {type(dim).__name__}")
  lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
  if not lo <= dim <= hi:
    raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {dim})")
  return int(dim) % max(ndim, 1)


def _is_contiguous(t) -> bool:
  """Whether t's layout (alias.layout: torch's strides for a view) is row-major without gaps (size-1 dims free)."""
  a = t._alias
  if a is None or type(a[1]) is not tuple or not a[1]: return True
  strides, acc = alias.layout(t)[0], 1
  for n, s in zip(reversed(t.shape), reversed(strides)):
    if n != 1 and s != acc: return False
    acc *= n
  return True


def _norm_dims(dims, ndim: int) -> tuple:
  if dims is None: return tuple(range(ndim))
  if isinstance(dims, (int, np.integer)): dims = (dims,)
  out = tuple(_norm_dim(d, ndim) for d in dims)
  if len(set(out)) != len(out): raise RuntimeError(f"dim {tuple(dims)} appears multiple times in the list of dims")
  return out if ndim > 0 else ()


def _all_if_empty(dim):
  """sum, mean, var and std read an empty dim list as every dim, as PyTorch does (any and all do not)"""
  return None if isinstance(dim, (tuple, list)) and len(dim) == 0 else dim


def _shape_arg(shape) -> tuple:
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  out = []
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
      raise TypeError(f"shape must be a sequence of ints, got {shape!r}")
    out.append(s if type(s) is BoundDim else int(s))   # a runtime size keeps its Variable (graph/dims.py)
  _check_numel(out)
  return tuple(out)


def _check_numel(shape) -> None:
  """Element counts (and byte offsets) are int64 in kernels and PyTorch: a shape past that is refused here, not
  wrapped or failed on in numpy later."""
  n = 1
  for s in shape:
    if s > 0: n *= s
  if n >= 1 << 63:
    raise RuntimeError(f"Storage size calculation overflowed with sizes={list(shape)} (more than 2**63 - 1 elements)")


def broadcast_shapes(*shapes) -> tuple:
  if len(shapes) == 2 and shapes[0] == shapes[1] or len(shapes) == 1: return tuple(shapes[0])
  nd = max((len(s) for s in shapes), default=0)
  out = []
  for i in range(nd):
    size = 1
    for s in shapes:
      d = s[i - nd + len(s)] if i - nd + len(s) >= 0 else 1
      if d != 1 or type(d) is BoundDim:
        if size != 1 and d != size:
          a, b = [x for x in shapes if (x[i - nd + len(x)] if i - nd + len(x) >= 0 else 1) != 1][:2]
          raise RuntimeError(f"The size of tensor a ({size}) must match the size of tensor b ({d}) at non-singleton "
                             f"dimension {i} (shapes {tuple(shapes[0])} and {tuple(shapes[1]) if len(shapes) > 1 else ()})")
        if size == 1 or type(d) is BoundDim: size = d   # a runtime size wins over an equal plain one
    out.append(size)
  _check_numel(out)
  return tuple(out)


def _is_scalar(x) -> bool: return isinstance(x, (int, float, bool, np.integer, np.floating, np.bool_))


def _result_type(*operands) -> DType:
  # the common cases first: tensors of one dtype, a float tensor with Python numbers
  first = operands[0]
  if isinstance(first, Tensor):
    d = first.node.dtype
    for o in operands[1:]:
      if isinstance(o, Tensor):
        if o.node.dtype != d: break
      elif not (d.is_float and type(o) in (builtins.float, builtins.int)): break
    else:
      return d
  # numpy scalars promote like the Python scalars they hold, as in PyTorch
  return dt.result_type(*(o.item() if isinstance(o, np.generic) else o for o in operands))


# ---- the tensor ----------------------------------------------------------------------------------------------

class Tensor:
  # _alias: None, or (storage, view chain, history) once the tensor is viewed or written in place (alias.py)
  # _trace: None, or a replayed step's placeholder record (engine/trace.py: the tensor has no node until needed)
  __slots__ = ("node", "requires_grad", "grad", "_ctx", "_alias", "_trace", "__weakref__")
  __hash__ = object.__hash__
  __array_priority__ = 1000   # numpy defers to our reflected operators

  def __init__(self, data=None, dtype=None, device=None, requires_grad: bool = False, *, _node: Node | None = None):
    self.requires_grad, self.grad, self._ctx, self._alias, self._trace = False, None, None, None, None
    if _node is not None:
      self.node = _node
      if requires_grad: self.requires_grad_()
      return
    devname = rd.canonical(device)
    d = dt.to_dtype(dtype) if dtype is not None else None
    if isinstance(data, Tensor):
      t = data.to(devname)
      self.node = (t.to(d) if d is not None else t).node
      if requires_grad: self.requires_grad_()
      return
    arr, d = _to_numpy(data, d)
    d = d or dt.from_numpy(arr.dtype)
    _check_device_dtype(devname, d)
    if arr.size == 1 and arr.ndim <= 1 and d != dt.bfloat16:   # small constants need no buffer
      self.node = gn.const(arr.reshape(-1)[0].item(), d, arr.shape, devname)
      if requires_grad: self.requires_grad_()
      return
    buf = rd.Buffer(rd.get(devname), arr.size, d)
    if arr.size: buf.copyin(_host_bits(arr, d))
    self.node = gn.buffer_node(buf, d, arr.shape, devname)
    if requires_grad: self.requires_grad_()

  # ---- basic properties ----
  @property
  def shape(self) -> tuple: return self.node.shape
  @property
  def dtype(self) -> DType: return self.node.dtype
  @property
  def device(self) -> str: return self.node.device
  @property
  def ndim(self) -> int: return len(self.node.shape)
  def dim(self) -> int: return self.ndim
  def numel(self) -> int: return prod(self.shape)
  nelement = numel
  def element_size(self) -> int: return self.dtype.itemsize
  def is_floating_point(self) -> bool: return self.dtype.is_float
  def size(self, dim: int | None = None):
    return self.shape if dim is None else self.shape[_norm_dim(dim, self.ndim)]
  @property
  def T(self) -> "Tensor": return self.permute(*reversed(range(self.ndim)))
  @property
  def mT(self) -> "Tensor":
    if self.ndim < 2: raise RuntimeError(f"tensor.mT is only supported on matrices or batches of matrices. Got {self.ndim}-D tensor.")
    return self.transpose(-2, -1)

  def _new(self, node: Node) -> "Tensor": return Tensor(_node=node)

  def _prim(self, kind: str, arg, node: Node, *inputs: "Tensor") -> "Tensor":
    """A differentiable primitive: the new tensor, with its recipe recorded for autograd."""
    r = Tensor(_node=node)
    autograd.record(r, kind, arg, inputs or (self,))
    return r

  # ---- autograd ----
  def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
    if requires_grad and not self.dtype.is_float:
      raise RuntimeError(f"only Tensors of floating point dtype can require gradients (got {self.dtype.name})")
    if not requires_grad and self._ctx is not None:
      raise RuntimeError("you can only change requires_grad flags of leaf variables.")
    self.requires_grad = requires_grad
    return self
  def detach(self) -> "Tensor":
    """A tensor outside the graph that shares this one's storage (in-place ops on either reach the other)."""
    return alias.view(self, Tensor(_node=self.node), _DETACH)
  @property
  def data(self) -> "Tensor":
    d = self.detach()
    if _trace._seg[0] is not None: _trace.data_alias(d)   # (its methods are events in a step the trace follows)
    return d
  @data.setter
  def data(self, value: "Tensor") -> None:
    """t.data = v: t now shares v's storage (its old views keep the old one), keeping requires_grad, as torch."""
    if not isinstance(value, Tensor): raise TypeError(f"data must be a Tensor, got {type(value).__name__}")
    _jit.note_rebind(self)
    alias.leave(self)
    self.node = value.node
    a = value._alias
    if a is None or type(a[1]) is tuple: alias.view(value, self, _DETACH)
  def backward(self, gradient=None, retain_graph: bool | None = None, create_graph: bool = False, inputs=None) -> None:
    autograd.backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)
  def register_hook(self, hook) -> "autograd.RemovableHandle":
    """hook(grad) -> a new gradient or None, called when a backward computes this tensor's gradient (a leaf's
    before it is accumulated into .grad), as torch's. A backward with hooks runs its rules (no backward template)
    and is not replayed by the eager trace; fusegrad.jit refuses to capture it (replays run no Python)."""
    return autograd.register_hook(self, hook)
  def register_post_accumulate_grad_hook(self, hook) -> "autograd.RemovableHandle":
    """hook(tensor), called after a backward accumulated into this leaf's .grad (an optimizer step per parameter)."""
    return autograd.register_post_accumulate_grad_hook(self, hook)
  @property
  def is_leaf(self) -> bool: return self._ctx is None
  @property
  def grad_fn(self):
    """The recipe that made this tensor as torch's graph node (name(), next_functions), None for a leaf."""
    return None if self._ctx is None else autograd._function.GradFn(self._ctx)
  def retain_grad(self) -> None: autograd.retain_grad(self)
  @property
  def retains_grad(self) -> bool: return autograd.retains_grad(self)
  def __deepcopy__(self, memo) -> "Tensor":
    """copy.deepcopy (of a Module, as nn.TransformerEncoder clones its layer): a leaf on its own storage with
    the same value, requires_grad and a copy of .grad, as torch; torch refuses non-leaf tensors too."""
    if not self.is_leaf:
      raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol "
                         "at the moment")
    with autograd.no_grad(): out = Tensor(_node=self.detach().clone().node)
    if self.requires_grad: out.requires_grad_()
    if self.grad is not None: out.grad = copy.deepcopy(self.grad, memo)
    return out

  # ---- realizing ----
  def realize(self) -> "Tensor":
    from fusegrad.engine.realize import realize
    realize(self.node)
    return self

  def contiguous(self, memory_format=None) -> "Tensor":
    """torch's contiguous: self where its layout already is (writes to either reach both, as torch's `self`), else
    a copy; lazily, a CONTIGUOUS node (a value to store) either way."""
    a = self._alias
    if a is not None and type(a[1]) is tuple and a[1] and not _is_contiguous(self):
      return self._prim("CONTIGUOUS", None, gn.contiguous(self.node))    # a copy: a tensor of its own
    if self.node.realized or self.node.op == "BUFFER": return self
    r = self._prim("CONTIGUOUS", None, gn.contiguous(self.node))
    return alias.view(self, r, (("RESHAPE", self.shape),))   # self's value and storage (an identity view step)

  def numpy(self) -> np.ndarray:
    if self.dtype == dt.bfloat16:
      raise TypeError("Got unsupported ScalarType BFloat16: numpy has no bfloat16; call .float() first")
    n = self.node
    if n.op == "CONST" and not n.realized:
      return np.full(self.shape, n.arg, dtype=self.dtype.np)
    if not n.realized:
      from fusegrad.engine.realize import realize
      realize(n)
    _jit.check_read(self)
    return from_storage(n.buffer.numpy(), self.shape)

  def __array__(self, dtype=None, copy=None):
    a = self.numpy()
    return a.astype(dtype) if dtype is not None else a

  def item(self):
    if self.numel() != 1:
      raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
    if self.dtype == dt.bfloat16: return self.float().item()
    return self.numpy().reshape(()).item()

  def tolist(self):
    if self.dtype == dt.bfloat16: return self.float().tolist()
    return self.numpy().tolist()

  def __repr__(self) -> str:
    if self.dtype == dt.bfloat16: body = np.array2string(self.float().numpy(), separator=", ", precision=4)
    else: body = np.array2string(self.numpy(), separator=", ", precision=4)
    extra = ""
    if self.device != "CPU": extra += f", device='{self.device}'"
    if self.dtype not in (dt.float32, dt.int64, dt.bool_): extra += f", dtype={self.dtype!r}"
    if self.requires_grad: extra += ", requires_grad=True"
    return f"tensor({body}{extra})"

  def __len__(self) -> int:
    if self.ndim == 0: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]

  def __iter__(self):
    if self.ndim == 0: raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))

  def __bool__(self) -> bool:
    if self.numel() != 1:
      raise RuntimeError(f"Boolean value of Tensor with {self.numel()} values is ambiguous")
    return bool(self.item())
  def __float__(self) -> float: return float(self.item())
  def __format__(self, spec: str) -> str:
    """f"{loss:.4f}": a one-element tensor formats its value (as torch's); others, and an empty spec, their repr."""
    if spec and self.numel() == 1: return format(self.item(), spec)
    return format(repr(self), spec)
  def __int__(self) -> int: return int(self.item())
  def __index__(self) -> int:
    if not (self.dtype.is_int or self.dtype.is_bool) or self.numel() != 1:
      raise TypeError("only integer tensors of a single element can be converted to an index")
    return int(self.item())

  # ---- devices and dtypes ----
  def to(self, *args, **kwargs) -> "Tensor":
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
      if isinstance(a, Tensor): device, dtype = a.device, a.dtype
      elif isinstance(a, DType) or (not isinstance(a, str) and a in (builtins.float, builtins.int, builtins.bool)): dtype = a
      elif isinstance(a, str) and a in dt.BY_NAME: dtype = a
      else: device = a
    out = self
    if dtype is not None: out = out._cast(dt.to_dtype(dtype))
    if device is not None:
      dev = rd.canonical(device)
      if dev != out.device:
        _check_device_dtype(dev, out.dtype)
        out = out._prim("COPY", dev, gn.copy_to(out.node, dev))
    if kwargs.get("copy") and out is self: out = self.clone()   # (a new tensor even where nothing changes, torch's)
    return out

  def cpu(self) -> "Tensor": return self.to("CPU")
  def type(self, dtype=None):
    if dtype is None: return f"fusegrad.{self.dtype.name}"
    return self._cast(dt.to_dtype(dtype))
  def _cast(self, d: DType) -> "Tensor":
    if d == self.dtype: return self
    _check_device_dtype(self.device, d)
    return self._prim("CAST", d, gn.cast(self.node, d))
  def float(self): return self._cast(dt.float32)
  def half(self): return self._cast(dt.float16)
  def double(self): return self._cast(dt.float64)
  def bfloat16(self): return self._cast(dt.bfloat16)
  def int(self): return self._cast(dt.int32)
  def long(self): return self._cast(dt.int64)
  def short(self): return self._cast(dt.int16)
  def char(self): return self._cast(dt.int8)
  def byte(self): return self._cast(dt.uint8)
  def bool(self): return self._cast(dt.bool_)

  # ---- elementwise machinery ----
  def _operand(self, x, d: DType) -> "Tensor":
    if isinstance(x, Tensor):
      if x.device != self.device:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{self.device} and {x.device}!")
      return x._cast(d)
    if _is_scalar(x) or isinstance(x, np.ndarray) and x.ndim == 0:
      return self._new(gn.const(x.item() if isinstance(x, np.generic | np.ndarray) else x, d, (), self.device))
    if isinstance(x, (list, tuple, np.ndarray)): return Tensor(x, device=self.device)._cast(d)
    raise TypeError(f"unsupported operand type {type(x).__name__} for a Tensor op")

  def _broadcast_to(self, shape) -> "Tensor":
    if self.shape == tuple(shape): return self
    n = self.node
    if n.op == "CONST" and not n.realized and not self.requires_grad:   # a constant is a constant at any shape
      return Tensor(_node=gn.const(n.arg, n.dtype, tuple(shape), n.device))
    shape = tuple(shape)
    x = self._prim("MOVE", ("EXPAND", shape), gn.broadcast(self.node, shape))   # leading dims too (_move_rule)
    # an operand broadcast for an op that autograd records: a gradient rule may save it, so it answers to
    # self's version counter (alias.py; no view: writes do not reach it)
    if self.requires_grad: x._alias = (alias.storage_of(self), None, None)
    return x

  def _mv(self, op: str, arg) -> "Tensor":
    return self._prim("MOVE", (op, arg), gn.movement(self.node, op, arg))

  def _view(self, op: str, arg) -> "Tensor":
    """A movement whose result is a view of this tensor (shares its storage, as PyTorch's views do)."""
    return alias.view(self, self._prim("MOVE", (op, arg), gn.movement(self.node, op, arg)), ((op, arg),))

  def _alu(self, op: str, *others, dtype: DType | None = None, out: DType | None = None) -> "Tensor":
    """Apply a primitive op with PyTorch's promotion and broadcasting; `dtype` forces the compute dtype."""
    if out is None and len(others) == 1 and (dtype is None or dtype is self.node.dtype):
      # the common cases without the general machinery: two tensors of one dtype, shape and device, or a float
      # tensor and a Python number (a constant of the tensor's dtype and shape); a compute dtype that is the
      # tensor's own changes neither
      o, n = others[0], self.node
      if type(o) is Tensor:
        on = o.node
        if on.dtype is n.dtype and on.shape == n.shape and on.device == n.device:
          return self._prim("ALU", op, gn.alu(op, n, on), self, o)
      elif (type(o) is builtins.float or type(o) is builtins.int) and n.dtype.is_float:
        c = Tensor(_node=gn.const(o, n.dtype, n.shape, n.device))
        return self._prim("ALU", op, gn.alu(op, n, c.node), self, c)
    d = dtype or _result_type(self, *others)
    ts = [self._cast(d)] + [self._operand(o, d) for o in others]
    shape = broadcast_shapes(*[t.shape for t in ts])
    ts = [t._broadcast_to(shape) for t in ts]
    r = ts[0]._prim("ALU", op, gn.alu(op, *[t.node for t in ts]), *ts)
    return r._cast(out) if out is not None else r

  def _float_dtype(self, *others) -> DType:
    d = _result_type(self, *others)
    return d if d.is_float else dt.default_float

  def _unary_float(self, op: str) -> "Tensor":
    return self._cast(self._float_dtype())._alu(op)

  # ---- unary ----
  def neg(self):
    if self.dtype.is_bool:
      raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. Use logical_not() instead.")
    return self._alu("NEG")
  def exp(self): return self._unary_float("EXP")
  @_float32_inside
  def exp2(self): return (self._cast(self._float_dtype()) * math.log(2)).exp()
  @_float32_inside
  def expm1(self):
    x = self._cast(self._float_dtype())
    with autograd.no_grad():   # its own gradient rule, exp(x)
      u = x.exp()
      um = u - 1
      # Kahan: (u - 1) * x / log(u) cancels the rounding error of u; u == 1 means |x| is below half an ulp of 1,
      # u - 1 == -1 that expm1 rounds to -1, u == inf an overflow (the quotient would be inf / inf)
      out = where(u == 1, x, where((um == -1) | (u == float("inf")), um, um * (x / u.log())))
    return x._prim("EXPM1", None, out.node)
  def log(self): return self._unary_float("LOG")
  @_float32_inside
  def log2(self): return self.log() * (1 / math.log(2))
  @_float32_inside
  def log10(self): return self.log() * (1 / math.log(10))
  @_float32_inside
  def log1p(self):
    x = self._cast(self._float_dtype())
    with autograd.no_grad():   # its own gradient rule, 1 / (1 + x)
      u = x + 1
      # Kahan: log(u) * x / (u - 1) cancels the rounding error of 1 + x (u - 1 is exact); x / (u - 1) first so that
      # a large x cannot overflow the product
      out = where((u == 1) | (u == float("inf")), x, u.log() * (x / (u - 1)))
    return x._prim("LOG1P", None, out.node)
  def sqrt(self): return self._unary_float("SQRT")
  @_float32_inside
  def rsqrt(self): return self.sqrt().reciprocal()
  def sin(self): return self._unary_float("SIN")
  def cos(self): return self._unary_float("COS")
  def tan(self): return self._unary_float("TAN")
  def tanh(self): return self._unary_float("TANH")
  def erf(self): return self._unary_float("ERF")
  def reciprocal(self): return self._unary_float("RECIP")
  def abs(self): return self if self.dtype.is_bool or self.dtype.is_unsigned else self._alu("ABS")
  def square(self): return self.pow(2)
  def sign(self):
    if self.dtype.is_bool: return self
    out = (self > 0)._cast(self.dtype) - (self < 0)._cast(self.dtype)   # NaN gives 0, as in PyTorch
    # differentiable with a zero gradient, as PyTorch's (a loss through sign() still has a graph)
    return self._prim("ZERO_GRAD", None, out.node) if self.requires_grad and self.dtype.is_float else out
  def floor(self): return self if not self.dtype.is_float else self._alu("FLOOR")
  def ceil(self): return self if not self.dtype.is_float else self._alu("CEIL")
  def trunc(self): return self if not self.dtype.is_float else self._alu("TRUNC")
  def round(self, decimals: int = 0):
    if not self.dtype.is_float: return self
    if decimals == 0: return self._alu("RINT")
    s = 10.0 ** decimals
    return (self * s)._alu("RINT") / s
  def frac(self): return self - self.trunc()
  def isnan(self): return self._alu("ISNAN") if self.dtype.is_float else self._new(gn.const(False, dt.bool_, self.shape, self.device))
  def isinf(self):
    if not self.dtype.is_float: return self._new(gn.const(False, dt.bool_, self.shape, self.device))
    return self.abs() == float("inf")
  def isfinite(self): return (self.isnan() | self.isinf()).logical_not()
  def logical_not(self): return self._cast(dt.bool_)._alu("NOT")
  def bitwise_not(self):
    if self.dtype.is_float:   # PyTorch's exception type, as the other bitwise ops (_bitwise)
      raise NotImplementedError(f"bitwise_not is only implemented for integer and boolean tensors, not {self.dtype.name}")
    return self._alu("NOT")
  def relu(self):
    if self.dtype.is_bool: raise RuntimeError("Boolean inputs not supported for relu")
    n = self.node
    if n.dtype.is_float:   # where(x <= 0, 0, x) in nodes: the same graph without its Tensors (a third of the time)
      z = gn.const(0, n.dtype, n.shape, n.device)
      return self._prim("RELU", None, gn.alu("WHERE", gn.alu("CMPLE", n, z), z, n))
    with autograd.no_grad():
      out = where(self <= 0, 0, self)   # NaN stays NaN; the gradient at 0 is 0, as PyTorch's
    # its own rule reads the output (out > 0 exactly where x > 0): the input is then needed by nothing but the
    # relu, and a matmul's kernel can store relu(x @ w + b) itself (schedule.py's epilogues)
    return self._prim("RELU", None, out.node)
  @_float32_inside
  def sigmoid(self):
    x = self._cast(self._float_dtype())
    # its own gradient rule, out * (1 - out): stable for any x. e = exp(-|x|) never overflows; where(x >= 0,
    # 1 / (1 + e), e / (1 + e)): e / (1 + e) keeps sigmoid(-100) = 3.7e-44 (built as nodes: what the Tensor ops
    # would make, without their Tensors, promotion and recipes)
    n = x.node
    d, sh, dev = n.dtype, n.shape, n.device
    e = gn.alu("EXP", gn.alu("NEG", gn.alu("ABS", n)))
    ope = gn.alu("ADD", gn.const(1, d, sh, dev), e)
    out = gn.alu("WHERE", gn.alu("CMPLE", gn.const(0, d, sh, dev), n), gn.alu("RECIP", ope), gn.alu("DIV", e, ope))
    return x._prim("SIGMOID", None, out)
  @_float32_inside
  @templated
  def silu(self): return self * self.sigmoid()
  @_float32_inside
  @templated
  def gelu(self, approximate: str = "none"):
    x = self._cast(self._float_dtype())
    if approximate == "tanh":
      return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    if approximate != "none": raise ValueError(f"approximate argument must be either none or tanh, got {approximate!r}")
    return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
  @_float32_inside
  def elu(self, alpha: float = 1.0):
    x = self._cast(self._float_dtype())
    neg = x <= 0   # PyTorch's test: a NaN takes the x branch, so its gradient is 1 as there
    return where(neg, alpha * where(neg, x, 0.0).expm1(), x)   # the unused branch sees a safe input
  def leaky_relu(self, negative_slope: float = 0.01):
    x = self._cast(self._float_dtype())
    return where(x > 0, x, x * negative_slope)
  @_float32_inside
  def softplus(self, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, x itself where beta x > threshold (PyTorch's definition)."""
    x = self._cast(self._float_dtype())
    with autograd.no_grad():   # its own gradient rule, sigmoid(beta x) (1 past the threshold)
      bx = x * beta
      # max(bx, 0) + log1p(exp(-|bx|)): exp never overflows and softplus(-100) = 3.7e-44, not log(1 + tiny) = 0
      sp = where(bx > 0, bx, 0.0) + (-bx.abs()).exp().log1p()
      out = where(bx > threshold, x, sp / beta if beta != 1 else sp)
    return x._prim("SOFTPLUS", (beta, threshold), out.node)
  @_float32_inside
  def mish(self): return self * self.softplus().tanh()
  # PyTorch's hard activations pass gradient strictly inside their linear range
  def hardtanh(self, min_val=-1.0, max_val=1.0): return where(self <= min_val, min_val, where(self >= max_val, max_val, self))
  def relu6(self): return self.hardtanh(0.0, 6.0)
  @_float32_inside
  def hardsigmoid(self): return where(self <= -3, 0.0, where(self >= 3, 1.0, self / 6 + 0.5))
  @_float32_inside
  def hardswish(self): return where(self <= -3, self * 0.0, where(self >= 3, self, self * (self + 3) / 6))   # -0, -inf: NaN (torch's)

  # ---- binary ----
  def add(self, other, alpha=None):
    if alpha is not None:
      _check_alpha(self, other, alpha)
      if _result_type(self, other) in HALF_FLOATS: return self._half_alpha("add", other, alpha)
      if _result_type(self, other).is_bool: other = other * bool(alpha)   # (PyTorch casts alpha to the bool result)
      else: other = other * alpha
    d = _result_type(self, other)
    return self._alu("OR" if d.is_bool else "ADD", other)
  def sub(self, other, alpha=None):
    if alpha is not None: _check_alpha(self, other, alpha)
    if alpha is not None and _result_type(self, other) in HALF_FLOATS: return self._half_alpha("sub", other, alpha)
    if alpha is not None: other = other * alpha
    _check_sub(self, other)
    return self._alu("SUB", other)
  def mul(self, other):
    d = _result_type(self, other)
    if d in HALF_FLOATS and _is_scalar(other): return self._scalar_in_float32("MUL", other, d)
    return self._alu("AND" if d.is_bool else "MUL", other)
  def _half_alpha(self, op: str, other, alpha) -> "Tensor":
    """add/sub with alpha into float16/bfloat16: alpha in that dtype, self + alpha * other in float32, one
    rounding (PyTorch's add kernel)."""
    d = _result_type(self, other)
    a = gn.cast_scalar(alpha, d)
    x, y = self._cast(d)._cast(dt.float32), self._operand(other, d)._cast(dt.float32)
    return getattr(x, op)(y._alu("MUL", a, dtype=dt.float32))._cast(d)
  def _scalar_in_float32(self, op: str, other, d: DType) -> "Tensor":
    """A 16-bit tensor times or over a Python scalar: PyTorch's kernel takes the scalar's float32 value (not
    its value in the tensor's dtype, as add and sub do), computes in float32 and rounds once."""
    return self._cast(dt.float32)._alu(op, other, dtype=dt.float32)._cast(d)
  def div(self, other, rounding_mode: str | None = None):
    if rounding_mode is None:
      d = self._float_dtype(other)
      if d in HALF_FLOATS and _is_scalar(other): return self._scalar_in_float32("DIV", other, d)
      return self._alu("DIV", other, dtype=d)
    if rounding_mode == "trunc":
      d = _result_type(self, other)
      if d in HALF_FLOATS:   # truncated in float32 and rounded once, as PyTorch's div_trunc does (34 - 0.1 is 33)
        b = other if _is_scalar(other) else self._operand(other, d)._cast(dt.float32)
        return self._cast(dt.float32).div(b, rounding_mode="trunc")._cast(d)
      q = self._alu("DIV", other, dtype=d)
      return q.trunc() if d.is_float else q
    if rounding_mode == "floor": return self.floor_divide(other)
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found {rounding_mode!r}")
  true_divide = div
  def floor_divide(self, other):
    d = _result_type(self, other)
    if d in HALF_FLOATS:   # in float32, rounded once; a Python scalar in float32 too (PyTorch's div_floor)
      b = other if _is_scalar(other) else self._operand(other, d)._cast(dt.float32)
      return self._cast(dt.float32).floor_divide(b)._cast(d)
    a, b = self._cast(d), self._operand(other, d)
    if d.is_float:
      # as PyTorch (c10 div_floor_floating) does it, through fmod: inf // 1.5 is nan and 1 // 0.1 is 9
      mod = a._alu("MOD", b)
      div = (a - mod)._alu("DIV", b)
      div = where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
      fl = div.floor()
      fl = where(div - fl > 0.5, fl + 1, fl)
      q = a._alu("DIV", b)
      zero = where(q < 0, -0.0, 0.0)._cast(d)
      return where(b == 0, q, where(div == 0, zero, fl))
    q = a._alu("DIV", b)
    r = a._alu("MOD", b)
    adjust = (r != 0) & ((r < 0) != (b < 0))
    return q - adjust._cast(d)
  def remainder(self, other):
    d = _result_type(self, other)
    if d in HALF_FLOATS:   # a scalar in the tensor's dtype, the rest in float32, rounded once (PyTorch's)
      return self._cast(dt.float32).remainder(self._operand(other, d)._cast(dt.float32))._cast(d)
    a, b = self._cast(d), self._operand(other, d)
    r = a._alu("MOD", b)
    adjust = (r != 0) & ((r < 0) != (b < 0))
    return where(adjust, r + b, r)
  def fmod(self, other): return self._alu("MOD", other)
  def pow(self, exponent):
    if _is_scalar(exponent) and not isinstance(exponent, bool):
      if exponent == 2:
        x = self._cast(_result_type(self, exponent))   # bool ** 2 is int64
        return x * x
      if exponent == 1: return self._cast(_result_type(self, exponent))
      if exponent == 0.5 and self.dtype.is_float: return self.sqrt()
      if exponent == -1 and self.dtype.is_float: return self.reciprocal()
      # (x * x) * x, as PyTorch's CPU kernel spells it: bit for bit in float32 and float64 (a 16-bit float keeps POW
      # and its one rounding), gradients equal at zeros of either sign; a powf call per element ran scalar (NewGELU's
      # x ** 3 was 2 ms of a minGPT step). (1 / (x * x) and rsqrt for -2 and -0.5 would differ from PyTorch's
      # gradient at +-0: NaN or the other infinity.)
      d = _result_type(self, exponent)
      if exponent == 3 and d in (dt.float32, dt.float64):
        x = self._cast(d)
        return x * x * x
    d = _result_type(self, exponent)
    if d.is_float: return self._alu("POW", exponent, dtype=d)
    if d.is_bool: return self.logical_or(self._operand(exponent, d).logical_not())
    # integer powers by squaring: exact, and wrapping on overflow as PyTorch's do
    base = self._cast(d)
    if not isinstance(exponent, Tensor):
      if exponent < 0: raise RuntimeError("Integers to negative integer powers are not allowed.")
      out, bits = None, int(exponent)
      while bits:
        if bits & 1: out = base if out is None else out * base
        bits >>= 1
        if bits: base = base * base
      return out if out is not None else base._operand(1, d)._broadcast_to(self.shape)
    e = base._operand(exponent, d)
    shape = broadcast_shapes(base.shape, e.shape)
    base, e = base._broadcast_to(shape), e._broadcast_to(shape)
    out = base._operand(1, d)._broadcast_to(shape)
    for bit in range(d.itemsize * 8 - 1):
      out = where((e >> bit) & 1 == 1, out * base, out)
      base = base * base
    x = self._cast(d)._broadcast_to(shape)   # negative exponents: 1 for base 1, +-1 for base -1, else 0
    return where(e < 0, where(x == 1, 1, where(x == -1, out, 0)), out)
  def maximum(self, other): return self._alu("MAX", other)
  def minimum(self, other): return self._alu("MIN", other)
  def fmax(self, other):
    o = self._operand(other, _result_type(self, other))
    return where((self >= o) | o.isnan(), self, o)   # NaN loses; ties (and their gradient) go to self
  def fmin(self, other):
    o = self._operand(other, _result_type(self, other))
    return where((self <= o) | o.isnan(), self, o)
  def eq(self, other): return self._alu("CMPEQ", other)
  def ne(self, other): return self._alu("CMPNE", other)
  def lt(self, other): return self._alu("CMPLT", other)
  def le(self, other): return self._alu("CMPLE", other)
  def gt(self, other): return _rev(other, self)._alu("CMPLT", self) if isinstance(other, Tensor) else self._gt_scalar(other)
  def ge(self, other): return _rev(other, self)._alu("CMPLE", self) if isinstance(other, Tensor) else self._ge_scalar(other)
  def _gt_scalar(self, other):
    n = self.node
    if n.dtype.is_float and type(other) in _PLAIN_NUMBER:   # the graph below, as nodes
      return Tensor(_node=gn.alu("CMPLT", gn.const(other, n.dtype, n.shape, n.device), n))
    d = _result_type(self, other)
    return self._operand(other, d)._broadcast_to(self.shape)._alu("CMPLT", self._cast(d), dtype=d)
  def _ge_scalar(self, other):
    n = self.node
    if n.dtype.is_float and type(other) in _PLAIN_NUMBER:
      return Tensor(_node=gn.alu("CMPLE", gn.const(other, n.dtype, n.shape, n.device), n))
    d = _result_type(self, other)
    return self._operand(other, d)._broadcast_to(self.shape)._alu("CMPLE", self._cast(d), dtype=d)
  def logical_and(self, other): return self._cast(dt.bool_)._alu("AND", _as_bool(other, self))
  def logical_or(self, other): return self._cast(dt.bool_)._alu("OR", _as_bool(other, self))
  def logical_xor(self, other): return self._cast(dt.bool_)._alu("XOR", _as_bool(other, self))
  def _bitwise(self, op, other):
    d = _result_type(self, other)
    if d.is_float:
      raise NotImplementedError(f"bitwise ops are only implemented for integer and boolean tensors, not for "
                                f"{d.name} (shapes {self.shape} and {getattr(other, 'shape', ())})")
    return self._alu(op, other)
  def bitwise_and(self, other): return self._bitwise("AND", other)
  def bitwise_or(self, other): return self._bitwise("OR", other)
  def bitwise_xor(self, other): return self._bitwise("XOR", other)
  def bitwise_left_shift(self, other): return self._bitwise("SHL", other)
  def bitwise_right_shift(self, other): return self._bitwise("SHR", other)
  def where(self, condition, other): return where(condition, self, other)
  def clamp(self, min=None, max=None):
    if min is None and max is None: raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    # selects, not maximum/minimum: the gradient is 1 on [min, max] inclusive, as PyTorch's, and NaN stays; a NaN
    # bound gives NaN, as PyTorch's (a comparison with it is false: it is selected explicitly)
    n = self.node
    if n.dtype.is_float and type(min) in _PLAIN_BOUND and type(max) in _PLAIN_BOUND:
      # the graph the selects below make, as nodes: where(x < min, min, x), then where(max < x, max, x)
      out = self
      for v, lo in ((min, True), (max, False)):
        if v is None: continue
        x, c = out.node, gn.const(v, n.dtype, n.shape, n.device)
        cond = gn.const(True, dt.bool_, n.shape, n.device) if v != v else \
            gn.alu("CMPLT", x, c) if lo else gn.alu("CMPLT", c, x)
        out = out._prim("ALU", "WHERE", gn.alu("WHERE", cond, c, x), Tensor(_node=cond), Tensor(_node=c), out)
      return out
    out = self
    nan = lambda b: b.isnan() if isinstance(b, Tensor) else b != b
    if min is not None: out = where((out < min) | nan(min), min, out)
    if max is not None: out = where((out > max) | nan(max), max, out)
    return out
  clip = clamp
  def clamp_min(self, min): return self.clamp(min=min)
  def clamp_max(self, max): return self.clamp(max=max)
  def lerp(self, end, weight):
    d = self._float_dtype(end)
    s = self._cast(d)
    if d in HALF_FLOATS:   # PyTorch's lerp kernel: float32 inside (a Python weight too), one rounding
      w = weight if not isinstance(weight, Tensor) else weight._cast(dt.float32)
      return s._cast(dt.float32).lerp(s._operand(end, d)._cast(dt.float32), w)._cast(d)
    return s + weight * (s._operand(end, d) - s)
  def addcmul(self, t1, t2, value=1): return _half_in_float32(lambda a, b, c: a + value * b * c, self, t1, t2)
  def addcdiv(self, t1, t2, value=1): return _half_in_float32(lambda a, b, c: a + value * b / c, self, t1, t2)

  __add__ = add
  __sub__ = sub
  __mul__ = mul
  __truediv__ = div
  __floordiv__ = floor_divide
  __mod__ = remainder
  __pow__ = pow
  __and__ = bitwise_and
  __or__ = bitwise_or
  __xor__ = bitwise_xor
  __lshift__ = bitwise_left_shift
  __rshift__ = bitwise_right_shift
  def __radd__(self, o): return _rev(o, self).add(self)
  def __rsub__(self, o):
    _check_sub(self, o)
    return _rev(o, self).sub(self)
  def __rmul__(self, o): return self.mul(o) if _is_scalar(o) else _rev(o, self).mul(self)
  def __rtruediv__(self, o):   # the scalar joins in the float dtype: -3 / uint8 is not 253 / uint8
    if self.dtype in HALF_FLOATS and _is_scalar(o): return self.reciprocal() * o   # PyTorch's __rdiv__, rounded twice
    return (o if isinstance(o, Tensor) else self._operand(o, self._float_dtype(o))).div(self)
  def __rfloordiv__(self, o): return _rev(o, self).floor_divide(self)
  def __rmod__(self, o): return _rev(o, self).remainder(self)
  def __rpow__(self, o): return _rev(o, self).pow(self)
  def __rand__(self, o): return _rev(o, self).bitwise_and(self)
  def __ror__(self, o): return _rev(o, self).bitwise_or(self)
  def __rxor__(self, o): return _rev(o, self).bitwise_xor(self)
  def __rlshift__(self, o): return _rev(o, self).bitwise_left_shift(self)
  def __rrshift__(self, o): return _rev(o, self).bitwise_right_shift(self)
  def __rmatmul__(self, o): return _rev(o, self).matmul(self)
  def __neg__(self): return self.neg()
  def __pos__(self): return self
  def __abs__(self): return self.abs()
  def __invert__(self):
    if self.dtype.is_float:   # PyTorch's `~` raises TypeError where its bitwise_not raises NotImplementedError
      raise TypeError(f"~ (operator.invert) is only implemented on integer and Boolean-type tensors, not {self.dtype.name}")
    return self.bitwise_not()
  def __eq__(self, o):   # type: ignore[override]
    if o is None: return False   # (torch's: `t == None` is False, not an elementwise comparison)
    return self.eq(o)
  def __ne__(self, o): return self.ne(o)      # type: ignore[override]
  def __lt__(self, o): return self.lt(o)
  def __le__(self, o): return self.le(o)
  def __gt__(self, o): return self.gt(o)
  def __ge__(self, o): return self.ge(o)
  def __matmul__(self, o): return self.matmul(o)

  # in-place ops rebind this tensor to the new lazy value (dtype kept, as PyTorch keeps it)
  def _inplace(self, r: "Tensor") -> "Tensor":
    if r.shape != self.shape:
      raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(r.shape)}")
    # (PyTorch's can_cast: bool < integer < float, signed and unsigned integers alike: uint8 += int32 wraps)
    if r.dtype != self.dtype and (0, 1, 1, 2)[r.dtype.category] > (0, 1, 1, 2)[self.dtype.category]:
      raise RuntimeError(f"result type {r.dtype.name} can't be cast to the desired output type {self.dtype.name}")
    return self._assign(r._cast(self.dtype))

  def _assign(self, r: "Tensor") -> "Tensor":
    """Give this tensor a new lazy value in place (r: same shape and dtype): the tensors sharing its storage
    see it, and autograd stays consistent (alias.write)."""
    if self.requires_grad and self._ctx is None and autograd.grad_enabled():
      raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    alias.write(self, r)
    return self
  def __iadd__(self, o): return self._inplace(self + o)
  def __isub__(self, o): return self._inplace(self - o)
  def __imul__(self, o): return self._inplace(self * o)
  def __itruediv__(self, o): return self._inplace(self / o)
  def __ifloordiv__(self, o): return self._inplace(self // o)
  def __imod__(self, o): return self._inplace(self % o)
  def __ipow__(self, o): return self._inplace(self ** o)
  def __iand__(self, o): return self._inplace(self & o)
  def __ior__(self, o): return self._inplace(self | o)
  def __ixor__(self, o): return self._inplace(self ^ o)
  def add_(self, o, alpha=None): return self._inplace(self.add(o, alpha=alpha))
  def sub_(self, o, alpha=None): return self._inplace(self.sub(o, alpha=alpha))
  def mul_(self, o): return self._inplace(self * o)
  def div_(self, o): return self._inplace(self / o)
  def clamp_(self, min=None, max=None): return self._inplace(self.clamp(min, max))
  def clamp_min_(self, min): return self._inplace(self.clamp(min=min))
  def clamp_max_(self, max): return self._inplace(self.clamp(max=max))
  def pow_(self, exponent): return self._inplace(self.pow(exponent))
  def neg_(self): return self._inplace(self.neg())
  def abs_(self): return self._inplace(self.abs())
  def exp_(self): return self._inplace(self.exp())
  def log_(self): return self._inplace(self.log())
  def sqrt_(self): return self._inplace(self.sqrt())
  def tanh_(self): return self._inplace(self.tanh())
  def sigmoid_(self): return self._inplace(self.sigmoid())
  def relu_(self): return self._inplace(self.relu())
  def masked_fill_(self, mask, value): return self._inplace(self.masked_fill(mask, value))
  def zero_(self): return self.fill_(0)
  def fill_(self, value):
    return self._assign(Tensor(_node=gn.const(value, self.dtype, self.shape, self.device)))
  def copy_(self, src: "Tensor"):
    src = src if isinstance(src, Tensor) else Tensor(src)
    return self._assign(src.to(self.device)._cast(self.dtype)._broadcast_to(self.shape))
  def uniform_(self, a: float = 0.0, b: float = 1.0):
    return self.copy_(rand(*self.shape, device=self.device) * (b - a) + a)
  def normal_(self, mean: float = 0.0, std: float = 1.0):
    return self.copy_(randn(*self.shape, device=self.device) * std + mean)

  # ---- reductions ----
  def _reduce(self, op: str, dim, keepdim: bool, selected: bool = False) -> "Tensor":
    # one REDUCE node, however big: the scheduler splits a big reduction into few outputs in two kernels
    # (schedule/rules.rewrite_reductions). `selected`: a max/min whose gradient goes to the maxima only, nothing
    # (not 0 * g) elsewhere (PyTorch's max() and min() of a whole tensor; its amax/amin multiply by the mask)
    axes = _norm_dims(dim, self.ndim)
    x = self
    # size-1 axes reduce nothing (a runtime size of value 1 still reduces: its kernel serves every value)
    real = tuple(sorted(a for a in axes if self.shape[a] != 1 or type(self.shape[a]) is BoundDim))
    if real: x = self._prim("REDUCE", (op, real, True) if selected else (op, real), gn.reduce(x.node, op, real))
    if not keepdim:   # a reduction's result is a new tensor, even where it reduces nothing
      shape = tuple(s for i, s in enumerate(self.shape) if i not in axes)
      if shape != x.shape: x = x._mv("RESHAPE", shape)
    return x

  def sum(self, dim=None, keepdim: bool = False, dtype=None):
    dim = _all_if_empty(dim)
    x = self._cast(dt.to_dtype(dtype)) if dtype is not None else \
        self._cast(dt.int64) if (self.dtype.is_int or self.dtype.is_bool) else self
    return x._reduce("SUM", dim, keepdim)
  def prod(self, dim=None, keepdim: bool = False, dtype=None):
    x = self._cast(dt.to_dtype(dtype)) if dtype is not None else \
        self._cast(dt.int64) if (self.dtype.is_int or self.dtype.is_bool) else self
    return x._reduce("PROD", dim, keepdim)
  def _check_nonempty(self, name: str, dim):
    axes = _norm_dims(dim, self.ndim)
    if dim is not None and self.numel() == 0 and any(self.shape[a] == 0 for a in axes):
      raise IndexError(f"{name}(): Expected reduction dim {axes[0]} to have non-zero size (shape {self.shape})")
    if self.numel() == 0 and dim is None:
      raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0, or the reduced "
                       f"dim to be non-empty (shape {self.shape})")
  def max(self, dim=None, keepdim: bool = False):
    if isinstance(dim, Tensor): return self.maximum(dim)
    self._check_nonempty("max", dim)
    if dim is None: return self._reduce("MAX", None, False, selected=True)
    return self._min_max_dim("MAX", dim, keepdim)
  def min(self, dim=None, keepdim: bool = False):
    if isinstance(dim, Tensor): return self.minimum(dim)
    self._check_nonempty("min", dim)
    if dim is None: return self._reduce("MIN", None, False, selected=True)
    return self._min_max_dim("MIN", dim, keepdim)
  def _min_max_dim(self, op: str, dim, keepdim: bool):
    if self.ndim == 0:
      _norm_dim(dim, 0)
      return ReturnMinMax(self, Tensor(_node=gn.const(0, dt.int64, (), self.device)))
    idx = self.argmax(dim, True) if op == "MAX" else self.argmin(dim, True)
    if not self.requires_grad or not autograd.grad_enabled():
      vals = self._reduce(op, dim, keepdim)
    else:   # the gradient goes to the returned index only, as PyTorch's does
      d = _norm_dim(dim, self.ndim)
      hit = arange(self.shape[d], device=self.device).reshape(*[-1 if i == d else 1 for i in range(self.ndim)]) == idx
      vals = where(hit, self, 0).sum(d, keepdim=keepdim)
    return ReturnMinMax(vals, idx if keepdim else idx.squeeze(dim))
  def amax(self, dim=None, keepdim: bool = False):
    self._check_nonempty("amax", dim)
    return self._reduce("MAX", dim if dim != () else None, keepdim)
  def amin(self, dim=None, keepdim: bool = False):
    self._check_nonempty("amin", dim)
    return self._reduce("MIN", dim if dim != () else None, keepdim)
  def mean(self, dim=None, keepdim: bool = False, dtype=None):
    dim = _all_if_empty(dim)
    x = self._cast(dt.to_dtype(dtype)) if dtype is not None else self
    if x.dtype in HALF_FLOATS:   # the sum and the division in float32, one rounding (PyTorch's mean)
      return x._cast(dt.float32).mean(dim, keepdim)._cast(x.dtype)
    if not x.dtype.is_float:
      raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point or "
                         f"complex dtype. Got: {x.dtype.name}")
    axes = _norm_dims(dim, self.ndim)
    n = prod(self.shape[a] for a in axes)
    return x.sum(dim, keepdim) / n if n else x.sum(dim, keepdim) * float("nan")
  @_float32_inside
  def _var_mean(self, dim, keepdim: bool, correction, unbiased) -> tuple:
    if correction is None: correction = 1 if unbiased is None or unbiased else 0
    axes = _norm_dims(_all_if_empty(dim), self.ndim)
    mean, _, var = _moments(self._cast(self._float_dtype()), axes, correction)
    if keepdim: return var, mean
    return var.squeeze(axes), mean.squeeze(axes)
  # PyTorch's overloads: var(dim, unbiased, keepdim) and var(unbiased) beside var(dim, *, correction, keepdim)
  def var(self, dim=None, *args, keepdim: bool = False, correction=None, unbiased=None):
    dim, keepdim, unbiased = _var_args(dim, args, keepdim, unbiased)
    return self._var_mean(dim, keepdim, correction, unbiased)[0]
  @_float32_inside
  def std(self, dim=None, *args, keepdim: bool = False, correction=None, unbiased=None):
    dim, keepdim, unbiased = _var_args(dim, args, keepdim, unbiased)
    return _sqrt0(self.var(dim, keepdim=keepdim, correction=correction, unbiased=unbiased))
  def var_mean(self, dim=None, *args, keepdim=False, correction=None, unbiased=None):
    dim, keepdim, unbiased = _var_args(dim, args, keepdim, unbiased)
    return self._var_mean(dim, keepdim, correction, unbiased)
  @_float32_inside
  def std_mean(self, dim=None, *args, keepdim=False, correction=None, unbiased=None):
    dim, keepdim, unbiased = _var_args(dim, args, keepdim, unbiased)
    v, m = self._var_mean(dim, keepdim, correction, unbiased)
    return _sqrt0(v), m
  @templated    # a dozen ops: recorded once per input structure
  def _arg(self, op: str, dim, keepdim: bool, name: str) -> "Tensor":
    self._check_nonempty(name, dim)
    if self.ndim == 0:   # a 0-d tensor takes dim 0 or -1, as in PyTorch: its one element is at index 0
      if dim is not None: _norm_dim(dim, 0)
      return Tensor(_node=gn.const(0, dt.int64, (), self.device))
    x = self
    if dim is None: x, dim, keepdim_shape = self.reshape(-1), 0, (1,) * self.ndim
    d = _norm_dim(dim, x.ndim)
    n = x.shape[d]
    best = x._reduce(op, d, True)
    hit = (x == best) | (x.isnan() if x.dtype.is_float else False)
    idx = arange(n, device=self.device).reshape(*[n if i == d else 1 for i in range(x.ndim)])
    cand = where(hit, idx, n)
    out = cand._reduce("MIN", d, True)
    if x is not self:
      return out.reshape(keepdim_shape) if keepdim else out.reshape(())
    return out if keepdim else out.squeeze(d)
  def argmax(self, dim=None, keepdim: bool = False): return self._arg("MAX", dim, keepdim, "argmax")
  def argmin(self, dim=None, keepdim: bool = False): return self._arg("MIN", dim, keepdim, "argmin")
  # PyTorch keeps uint8 for any/all of uint8 input
  def any(self, dim=None, keepdim: bool = False):
    return self._cast(dt.bool_)._reduce("MAX", dim, keepdim)._cast(dt.uint8 if self.dtype == dt.uint8 else dt.bool_)
  def all(self, dim=None, keepdim: bool = False):
    return self._cast(dt.bool_)._reduce("MIN", dim, keepdim)._cast(dt.uint8 if self.dtype == dt.uint8 else dt.bool_)
  @_float32_inside
  def logsumexp(self, dim, keepdim: bool = False):
    x = self._cast(self._float_dtype())
    m = Tensor(_node=x._reduce("MAX", dim, True).node)     # the shift's gradient cancels: leave it out of the graph
    m = where(m.isinf(), 0.0, m)
    out = (x - m).exp().sum(dim, keepdim=True).log() + m
    return out if keepdim else out.squeeze(_norm_dims(dim, self.ndim))
  @templated
  def softmax(self, dim: int = -1, dtype=None):
    _check_softmax_dim(dim, "softmax")
    x = self._cast(dt.to_dtype(dtype)) if dtype is not None else self._cast(self._float_dtype())
    if x.dtype in HALF_FLOATS: return x._cast(dt.float32).softmax(dim)._cast(x.dtype)   # one rounding, as PyTorch's
    e = (x - Tensor(_node=x._reduce("MAX", dim, True).node)).exp()   # detached
    return e / e.sum(dim, keepdim=True)
  @templated
  def log_softmax(self, dim: int = -1, dtype=None):
    _check_softmax_dim(dim, "log_softmax")
    x = self._cast(dt.to_dtype(dtype)) if dtype is not None else self._cast(self._float_dtype())
    if x.dtype in HALF_FLOATS: return x._cast(dt.float32).log_softmax(dim)._cast(x.dtype)
    s = x - Tensor(_node=x._reduce("MAX", dim, True).node)   # detached
    return s - s.exp().sum(dim, keepdim=True).log()
  def cumsum(self, dim: int, dtype=None):
    d = _norm_dim(dim, self.ndim)   # a 0-d tensor takes dim 0 or -1
    x = self._cast(dt.to_dtype(dtype)) if dtype is not None else \
        self._cast(dt.int64) if (self.dtype.is_int or self.dtype.is_bool) else self
    if self.ndim == 0: return x
    n = x.shape[d]
    if n <= 1: return x.clone()
    if x.dtype in HALF_FLOATS:   # accumulated in float32, each output rounded once (PyTorch's)
      return _scan_sum(x._cast(dt.float32).transpose(d, -1)).transpose(d, -1)._cast(x.dtype)
    return _scan_sum(x.transpose(d, -1)).transpose(d, -1)
  def cumprod(self, dim: int, dtype=None):
    d = _norm_dim(dim, self.ndim)
    x = self._cast(dt.to_dtype(dtype)) if dtype is not None else \
        self._cast(dt.int64) if (self.dtype.is_int or self.dtype.is_bool) else self
    if x.ndim == 0: return x
    n = x.shape[d]
    if n <= 1: return x.clone()   # nothing to multiply (and no window of an empty dim)
    return _scan_sum(x.transpose(d, -1), prod=True).transpose(d, -1)

  # ---- movement (views) ----
  def reshape(self, *shape) -> "Tensor":
    return self._reshape(_shape_arg(shape), False)
  def view(self, *shape, dtype=None) -> "Tensor":
    """torch's view: a view of self with the new shape (an error where self's layout cannot give one without a
    copy, as torch's), or with `view(dtype)` self's bits read as another dtype."""
    if dtype is not None and not shape: shape = (dtype,)
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int, np.integer)):
      from fusegrad.ops_math import view_dtype
      return view_dtype(self, shape[0])
    return self._reshape(_shape_arg(shape), True)
  def _reshape(self, shape, need_view: bool) -> "Tensor":
    if shape.count(-1) > 1: raise RuntimeError("only one dimension can be inferred")
    if any(s < -1 for s in shape): raise RuntimeError(f"invalid shape dimension {min(shape)}")
    if -1 in shape:
      known = prod(s for s in shape if s != -1)
      if known == 0 or self.numel() % known:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {self.numel()}")
      shape = tuple(self.numel() // known if s == -1 else s for s in shape)
    if prod(shape) != self.numel():
      raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {self.numel()}")
    if shape == self.shape: return self
    a = self._alias
    if a is not None and type(a[1]) is tuple and a[1] and \
       alias.reshape_strides(self.shape, alias.layout(self)[0], shape) is None:   # a view no shape can be seen through
      if need_view:
        raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one dimension "
                           "spans across two contiguous subspaces). Use .reshape(...) instead.")
      return self._mv("RESHAPE", shape)   # torch copies here: the result shares no storage with self
    return self._view("RESHAPE", shape)
  def view_as(self, other): return self.view(other.shape)
  def reshape_as(self, other): return self.reshape(other.shape)
  def permute(self, *dims) -> "Tensor":
    dims = _shape_arg(dims) if dims and not isinstance(dims[0], (tuple, list)) else tuple(dims[0]) if dims else ()
    if len(dims) != self.ndim:
      raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does not match the length "
                         f"of the desired ordering of dimensions i.e. input.dim() = {self.ndim} is not equal to "
                         f"len(dims) = {len(dims)}")
    order = _norm_dims(dims, self.ndim)
    if order == tuple(range(self.ndim)): return self
    return self._view("PERMUTE", order)
  def transpose(self, dim0: int, dim1: int) -> "Tensor":
    if self.ndim == 0: return self
    a, b = _norm_dim(dim0, self.ndim), _norm_dim(dim1, self.ndim)
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(*order)
  swapaxes = transpose
  def t(self):
    if self.ndim > 2: raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return self.T
  def expand(self, *shape) -> "Tensor":
    shape = _shape_arg(shape)
    if len(shape) < self.ndim:
      raise RuntimeError(f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to the number "
                         f"of dimensions in the tensor ({self.ndim})")
    old = (1,) * (len(shape) - self.ndim) + self.shape
    new = []
    for i, (o, s) in enumerate(zip(old, shape)):
      if s == -1:
        if i < len(shape) - self.ndim: raise RuntimeError("expand: -1 is not allowed in a leading, non-existing dimension")
        s = o
      if o != s and o != 1:
        raise RuntimeError(f"The expanded size of the tensor ({s}) must match the existing size ({o}) at non-singleton "
                           f"dimension {i}.  Target sizes: {list(shape)}.  Tensor sizes: {list(self.shape)}")
      new.append(s)
    new = tuple(new)
    if new == self.shape: return self
    ops = ((("RESHAPE", old),) if len(new) > self.ndim else ()) + (("EXPAND", new),)
    return alias.view(self, self._broadcast_to(new), ops)
  def expand_as(self, other): return self.expand(other.shape)
  def broadcast_to(self, shape): return self.expand(*shape)
  def squeeze(self, dim=None) -> "Tensor":
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    axes = _norm_dims(dim, self.ndim)
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in axes and s == 1)))
  def unsqueeze(self, dim: int) -> "Tensor":
    d = _norm_dim(dim, self.ndim + 1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
    if self.ndim == 0: return self.reshape(1)
    s, e = _norm_dim(start_dim, self.ndim), _norm_dim(end_dim, self.ndim)
    if s > e: raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def unflatten(self, dim: int, sizes) -> "Tensor":
    d = _norm_dim(dim, self.ndim)
    sizes = tuple(sizes)
    if -1 in sizes:
      known = prod(s for s in sizes if s != -1)
      sizes = tuple(self.shape[d] // known if s == -1 else s for s in sizes)
    if prod(sizes) != self.shape[d]:
      raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {dim} "
                         f"({self.shape[d]}) in the input tensor")
    return self.reshape(self.shape[:d] + sizes + self.shape[d + 1:])
  def flip(self, *dims) -> "Tensor":
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    axes = _norm_dims(dims, self.ndim)
    if not axes: return self
    return self._mv("FLIP", axes)
  def _shrink(self, bounds, view: bool = False) -> "Tensor":
    bounds = tuple(tuple(b) for b in bounds)
    if all(b == (0, s) and type(b[1]) is type(s) for b, s in zip(bounds, self.shape)): return self   # (a runtime size: kept)
    return self._view("SHRINK", bounds) if view else self._mv("SHRINK", bounds)
  def narrow(self, dim: int, start: int, length: int) -> "Tensor":
    d = _norm_dim(dim, self.ndim)
    if isinstance(start, Tensor): start = int(start.item())
    if not -self.shape[d] <= start <= self.shape[d]:
      raise IndexError(f"start out of range (expected to be in range of [{-self.shape[d]}, {self.shape[d]}], but got "
                       f"{start})")
    if start < 0: start += self.shape[d]
    if length < 0 or start + length > self.shape[d]:
      raise RuntimeError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size ({self.shape[d]}).")
    if type(length) is BoundDim and (start or length.var.hi > self.shape[d]):   # a runtime length (graph/dims.py)
      raise IndexError(f"narrow(): a runtime length ({length.var.name}, up to {length.var.hi}) needs start 0 and at "
                       f"most dimension {d}'s size {self.shape[d]}, got start {start}")
    end = length if not start else start + length
    return self._shrink([(start, end) if i == d else (0, s) for i, s in enumerate(self.shape)], view=True)
  def pad(self, padding, value=0.0, mode: str = "constant") -> "Tensor":
    """torch.nn.functional.pad: (left, right) pairs from the last dim backwards; modes constant,
    reflect, replicate and circular (the last three as views joined by one fused kernel)."""
    padding = tuple(int(p) for p in padding)
    if len(padding) % 2 or len(padding) // 2 > self.ndim:
      raise RuntimeError(f"Padding length must be divisible by 2 and at most twice the number of dimensions of the input "
                       f"({self.ndim}); got {len(padding)}")
    pads = [(0, 0)] * self.ndim
    for i in range(len(padding) // 2): pads[self.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
    if mode != "constant": return self._pad_edges(pads, mode)
    for (b, a), s in zip(pads, self.shape):
      if s + b + a < 0:
        raise RuntimeError(f"The input size {s}, plus negative padding {b} and {a} resulted in a negative output size")
    # negative padding removes elements
    x = self._shrink([(builtins.max(0, -b), s - builtins.max(0, -a)) for (b, a), s in zip(pads, self.shape)])
    pos = tuple((builtins.max(0, b), builtins.max(0, a)) for b, a in pads)
    if all(p == (0, 0) for p in pos): return x
    out = x._mv("PAD", pos)
    if value != 0:
      mask = x._new(gn.movement(gn.const(True, dt.bool_, x.shape, x.device), "PAD", pos))
      out = where(mask, out, value)._cast(self.dtype)
    return out

  def _pad_edges(self, pads, mode: str) -> "Tensor":
    if mode not in ("reflect", "replicate", "circular"):
      raise NotImplementedError(f"padding mode {mode!r}: expected constant, reflect, replicate or circular")
    for d, ((b, a), s) in enumerate(zip(pads, self.shape)):
      if s + b + a < 0:
        raise RuntimeError(f"The input size {s}, plus negative padding {b} and {a} resulted in a negative output size")
    # negative pads crop first, and the positive ones then pad what is left (PyTorch's order)
    x = self._shrink([(builtins.max(0, -b), s - builtins.max(0, -a)) for (b, a), s in zip(pads, self.shape)])
    pads = [(builtins.max(0, b), builtins.max(0, a)) for b, a in pads]
    for d, (b, a) in enumerate(pads):
      if (b, a) == (0, 0): continue
      n = x.shape[d]
      limit = n - 1 if mode == "reflect" else n if mode == "circular" else None
      if limit is not None and (b > limit or a > limit):
        raise RuntimeError(f"{mode} padding ({b}, {a}) of dim {d} must be at most {limit} for an input of size {n} "
                           f"(shape {list(self.shape)})")
      if n == 0: raise RuntimeError(f"{mode} padding of an empty dim {d} (shape {list(self.shape)})")
      if mode == "replicate":
        grow = lambda t, k: t.expand(*[k if i == d else s for i, s in enumerate(t.shape)])
        left, right = grow(x.narrow(d, 0, 1), b), grow(x.narrow(d, n - 1, 1), a)
      elif mode == "reflect":
        left, right = x.narrow(d, 1, b).flip(d), x.narrow(d, n - 1 - a, a).flip(d)
      else:
        left, right = x.narrow(d, n - b, b), x.narrow(d, 0, a)
      x = cat([left, x, right], d)
    return x

  def __getitem__(self, index) -> "Tensor":
    return _getitem(self, index)

  def __setitem__(self, index, value) -> None:
    # a lazy select: the indexed region takes the new values, everything else stays
    idx = index if isinstance(index, tuple) else (index,)
    if idx and all(isinstance(i, Tensor) for i in idx) and not (len(idx) == 1 and idx[0].dtype.is_bool and
                                                                (not isinstance(value, Tensor) or value.numel() == 1)):
      # x[i, j] = v, x[mask] = values: index_put_ (a position named twice keeps the last value, as PyTorch's CPU)
      val = value if isinstance(value, Tensor) else Tensor(value, dtype=self.dtype, device=self.device)
      self.index_put_(idx, val.to(self.device)._cast(self.dtype))
      return
    if isinstance(index, Tensor) and index.dtype.is_bool:   # x[mask] = scalar
      v = value.reshape(()) if isinstance(value, Tensor) else value
      self._assign(where(index._broadcast_to(broadcast_shapes(index.shape, self.shape)), v, self)._cast(self.dtype))
      return
    if builtins.any(isinstance(i, (Tensor, list, np.ndarray)) for i in idx):
      # advanced indices among ints and slices (x[idx, 1] = v, x[[0, 1], [1, 2]] += 1): the flat positions the same
      # index reads from an iota of self's shape (getitem's rules place the dims), then index_put into the flat value
      from fusegrad.indexing import index_put
      pos = _getitem(arange(self.numel(), device=self.device).reshape(self.shape), index)
      val = value if isinstance(value, Tensor) else Tensor(value, dtype=self.dtype, device=self.device)
      try: fits = broadcast_shapes(val.shape, pos.shape) == pos.shape
      except RuntimeError: fits = False
      if not fits:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(val.shape)} cannot be broadcast to indexing "
                           f"result of shape {list(pos.shape)}")
      val = val.to(self.device)._cast(self.dtype)._broadcast_to(pos.shape).reshape(-1)
      self._assign(index_put(self.reshape(-1), (pos.reshape(-1),), val).reshape(self.shape))
      return
    region = _getitem(self, index, basic_only=True, return_region=True)
    shape_in, place = region
    val = value if isinstance(value, Tensor) else Tensor(value, dtype=self.dtype, device=self.device)
    val = val.to(self.device)._cast(self.dtype).expand(*shape_in) if val.shape != shape_in else val._cast(self.dtype)
    placed, mask = place(val)
    self._assign(where(mask, placed, self))

  def split(self, split_size_or_sections, dim: int = 0):
    d = _norm_dim(dim, self.ndim)
    n = self.shape[d]
    if isinstance(split_size_or_sections, int):
      if split_size_or_sections <= 0 and n > 0: raise RuntimeError("split_size can only be 0 if dimension size is 0")
      sizes = [builtins.min(split_size_or_sections, n - i) for i in range(0, n, builtins.max(split_size_or_sections, 1))] or [0]
    else:
      sizes = list(split_size_or_sections)
      if sum(sizes) != n:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
                           f"dimension {dim}), but got split_sizes={sizes}")
    out, start = [], 0
    for s in sizes:
      out.append(self.narrow(d, start, s))
      start += s
    return tuple(out)
  def chunk(self, chunks: int, dim: int = 0):
    if chunks <= 0: raise RuntimeError("chunk expects `chunks` to be greater than 0")
    d = _norm_dim(dim, self.ndim)
    if self.shape[d] == 0: return tuple(self.narrow(d, 0, 0) for _ in range(chunks))   # as PyTorch: `chunks` empties
    return self.split(builtins.max(1, -(-self.shape[d] // chunks)), d)
  def unbind(self, dim: int = 0):
    d = _norm_dim(dim, self.ndim)
    return tuple(self.select(d, i) for i in range(self.shape[d]))
  def select(self, dim: int, index: int):
    d = _norm_dim(dim, self.ndim)
    return self[(slice(None),) * d + (index,)]
  def repeat(self, *sizes) -> "Tensor":
    sizes = _shape_arg(sizes)
    if len(sizes) < self.ndim:
      raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    base = (1,) * (len(sizes) - self.ndim) + self.shape
    x = self.reshape(tuple(v for s in base for v in (1, s)))
    x = x._broadcast_to(tuple(v for r, s in zip(sizes, base) for v in (r, s)))
    out = x._mv("RESHAPE", tuple(r * s for r, s in zip(sizes, base)))
    return out if out is not self else self.clone()   # a copy, as in PyTorch: no view of self
  def gather(self, dim: int, index: "Tensor") -> "Tensor":
    """out[i][j][k] = self[index[i][j][k]][j][k] (dim 0): one gather kernel."""
    d = _norm_dim(dim, self.ndim)
    if not isinstance(index, Tensor) or index.dtype.is_float or index.dtype.is_bool:
      raise RuntimeError(f"gather(): Expected dtype int64 for index, got {getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim != self.ndim:
      raise RuntimeError(f"Index tensor must have the same number of dimensions as input tensor "
                         f"(input {list(self.shape)}, index {list(index.shape)})")
    for k, (a, b) in enumerate(zip(index.shape, self.shape)):
      if k != d and a > b:
        raise RuntimeError(f"Size does not match at dimension {k} expected index {list(index.shape)} to be smaller "
                           f"than self {list(self.shape)} apart from dimension {d}")
    index = _index_in_range(index, self.shape[d] if self.ndim else 1, RuntimeError,
                            lambda v: f"index {v} is out of bounds for dimension {d} with size {self.shape[d] if self.ndim else 1}")
    idx = [index if k == d else arange(index.shape[k], device=self.device).reshape(
           *[index.shape[k] if j == k else 1 for j in range(self.ndim)]) for k in range(self.ndim)]
    # an index as large as the data but along dim: its gradient is a one-hot along that dim only (autograd
    # _gather_rule), not over every element of the data for every element gathered
    along = (d, index) if all(a == b for k, (a, b) in enumerate(zip(index.shape, self.shape)) if k != d) else None
    return _advanced(self, list(enumerate(idx)), along) if self.ndim else self
  def index_select(self, dim: int, index: "Tensor") -> "Tensor":
    d = _norm_dim(dim, self.ndim)
    if not isinstance(index, Tensor) or index.ndim > 1:
      raise IndexError(f"index_select(): Index is supposed to be a vector, got {getattr(index, 'shape', index)}")
    if index.dtype.is_float or index.dtype.is_bool:
      raise IndexError(f"index_select(): Expected dtype int32/int64 for index, got {index.dtype.name}")
    n = self.shape[d] if self.ndim else 1
    if self.ndim == 0 and index.numel() != 1:
      raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got {index.numel()} value(s)")
    index = _index_in_range(index, n, IndexError, lambda v: f"index out of range in self (index {v}, dimension {d} "
                                                              f"of size {n})")
    if self.ndim == 0: return self.reshape(1)[index.reshape(-1)].reshape(())
    return self[(slice(None),) * d + (index.reshape(-1),)]
  def masked_fill(self, mask: "Tensor", value) -> "Tensor":
    if not isinstance(mask, Tensor) or not mask.dtype.is_bool:
      raise RuntimeError(f"masked_fill only supports boolean masks, but got mask with dtype "
                         f"{getattr(mask, 'dtype', type(mask).__name__)}")
    broadcast_shapes(mask.shape, self.shape)
    if isinstance(value, Tensor):
      if value.ndim: raise RuntimeError(f"masked_fill only supports a 0-dimensional value tensor, but got tensor "
                                        f"with {value.ndim} dimension(s).")
      value = value._cast(self.dtype)
    out = where(mask, value, self)
    return out._cast(self.dtype)._broadcast_to(self.shape) if out.shape != self.shape or out.dtype != self.dtype else out
  def clone(self, *, memory_format=None) -> "Tensor":   # (memory_format: accepted; fusegrad keeps one layout)
    # values are immutable nodes, so a clone is a new tensor on the same value (x * 1 keeps -0.0 and NaN payloads);
    # in-place ops on it rebind only the clone
    if self.dtype.is_bool: return self.logical_or(False)
    return self._alu("MUL", self._new(gn.const(1, self.dtype, (), self.device)))
  def tile(self, *dims) -> "Tensor":
    dims = _shape_arg(dims)
    if len(dims) < self.ndim: dims = (1,) * (self.ndim - len(dims)) + dims
    return self.repeat(*dims)
  def tril(self, diagonal: int = 0) -> "Tensor": return self._tri(diagonal, lower=True)
  def triu(self, diagonal: int = 0) -> "Tensor": return self._tri(diagonal, lower=False)
  def _tri(self, diagonal: int, lower: bool) -> "Tensor":
    if self.ndim < 2: raise RuntimeError(f"tril/triu: input tensor must have at least 2 dimensions, got {self.ndim}")
    r, c = self.shape[-2:]
    i = arange(r, device=self.device).reshape(r, 1)
    j = arange(c, device=self.device).reshape(1, c)
    keep = (j - i <= diagonal) if lower else (j - i >= diagonal)
    return where(keep, self, self._new(gn.const(0, self.dtype, (), self.device)))

  # ---- linear algebra ----
  def matmul(self, other: "Tensor") -> "Tensor":
    if not isinstance(other, Tensor): other = self._operand(other, _result_type(self, other))
    a, b = self, other
    if a.ndim == 0 or b.ndim == 0:
      raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {a.ndim}D and {b.ndim}D")
    d = _result_type(a, b)
    a, b = a._cast(d), b._cast(d)
    va, vb = a.ndim == 1, b.ndim == 1
    if va: a = a.reshape(1, a.shape[0])
    if vb: b = b.reshape(b.shape[0], 1)
    if a.shape[-1] != b.shape[-2]:
      raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, self.shape))} and "
                         f"{'x'.join(map(str, other.shape))})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
    a0, b0 = a, b
    # one graph for every device: a sum over k of a [..., n, k, 1] * [..., 1, k, m] product; how the operands are laid
    # out for it (a transposed copy, panels) is the scheduler's choice (schedule/rules.relayout)
    # built on nodes (one MATMUL recipe for autograd: its gradients are matmuls again)
    an, bn = a.node, b.node
    if k:
      # float16/bfloat16: products and sum in float32, the result rounded once (PyTorch's CPU matmul)
      if d in HALF_FLOATS: an, bn = gn.cast(an, dt.float32), gn.cast(bn, dt.float32)
      full = batch + (n, k, m)
      an = gn.broadcast(gn.movement(gn.broadcast(an, batch + (n, k)), "RESHAPE", batch + (n, k, 1)), full)
      bn = gn.broadcast(gn.movement(gn.broadcast(bn, batch + (k, m)), "RESHAPE", batch + (1, k, m)), full)
      ax = len(batch) + 1
      r = gn.reduce(gn.alu("MUL" if not d.is_bool else "AND", an, bn), "SUM" if not d.is_bool else "MAX",
                    (ax,))
      node = gn.cast(gn.movement(r, "RESHAPE", batch + (n, m)), d)
    else: node = gn.const(0, d, batch + (n, m), self.device)
    out = a0._prim("MATMUL", None, node, a0, b0)
    if va: out = out.squeeze(-2)
    if vb: out = out.squeeze(-1)
    return out
  mm = matmul
  bmm = matmul
  def dot(self, other): return (self * other).sum()
  def outer(self, other): return self.reshape(-1, 1) * other.reshape(1, -1)

  # ---- PyTorch conveniences: new_* constructors (dtype and device from self), sampling, device moves ----
  def new_tensor(self, data, dtype=None, device=None, requires_grad: bool = False) -> "Tensor":
    if isinstance(data, Tensor): data = data.detach()   # a copy of the values, as PyTorch's (which warns)
    return Tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
  def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> "Tensor":
    return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
  def new_zeros(self, *size, dtype=None, device=None, requires_grad: bool = False) -> "Tensor":
    return self.new_full(_shape_arg(size), 0, dtype=dtype, device=device, requires_grad=requires_grad)
  def new_ones(self, *size, dtype=None, device=None, requires_grad: bool = False) -> "Tensor":
    return self.new_full(_shape_arg(size), 1, dtype=dtype, device=device, requires_grad=requires_grad)
  def new_empty(self, *size, dtype=None, device=None, requires_grad: bool = False) -> "Tensor":
    return self.new_zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)   # lazy zeros cost nothing
  def multinomial(self, num_samples: int, replacement: bool = False, *, generator=None) -> "Tensor":
    return multinomial(self, num_samples, replacement, generator=generator)
  def type_as(self, other: "Tensor") -> "Tensor": return self._cast(other.dtype)
  def cuda(self, device=None, non_blocking: bool = False) -> "Tensor":
    """Raises, naming fusegrad's devices, until fusegrad has a CUDA device (runtime/device.py canonical)."""
    return self.to("cuda" if device is None else device if not isinstance(device, int) else f"cuda:{device}")
  @property
  def is_cuda(self) -> bool: return self.device == "CUDA"


# ---- module-level helpers -------------------------------------------------------------------------------

def _half_in_float32(fn, *ts) -> Tensor:
  """fn over tensors whose result dtype is float16/bfloat16 computed in float32 and rounded once (PyTorch's
  kernels of addcmul/addcdiv do so); other dtypes run fn as is."""
  d = _result_type(*ts)
  if d not in HALF_FLOATS: return fn(*ts)
  return fn(*[t._cast(dt.float32) for t in ts])._cast(d)


_PLAIN_NUMBER = (builtins.int, builtins.float)   # scalars that ops build as nodes directly take their tensor's dtype
_PLAIN_BOUND = (type(None), *_PLAIN_NUMBER)


def _rev(o, like: Tensor) -> Tensor:
  """A reflected operand as a tensor of the promoted dtype (for 2 - x and friends)."""
  if isinstance(o, Tensor): return o
  return like._operand(o, _result_type(like, o))


def _check_alpha(a, b, alpha) -> None:
  """add/sub's alpha as PyTorch takes it: a float alpha into an integer or bool result is refused."""
  d = _result_type(a, b)
  if not d.is_float and isinstance(alpha, (float, np.floating)):
    raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")


def _check_sub(a, b) -> None:
  """PyTorch refuses subtraction with a bool on either side, whatever the other operand is."""
  if any(isinstance(x, (bool, np.bool_)) or isinstance(x, Tensor) and x.dtype.is_bool for x in (a, b)):
    raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to "
                       "invert a mask, use the `~` or `logical_not()` operator instead.")


def _var_args(dim, args: tuple, keepdim: bool, unbiased):
  """var/std's positional forms, as PyTorch parses them: (unbiased), (dim, unbiased[, keepdim]); a bool keepdim
  given as the second positional of the old (dim, keepdim) spelling is therefore `unbiased`, as there."""
  if isinstance(dim, bool): return None, keepdim, dim
  if len(args) > 2: raise TypeError(f"var(): too many positional arguments ({2 + len(args)})")
  if args: unbiased = args[0]
  if len(args) > 1: keepdim = args[1]
  return dim, keepdim, unbiased


def _check_softmax_dim(dim, name: str) -> None:
  # None would reduce over every dim (a softmax over the whole tensor); PyTorch's methods refuse it
  if dim is None or isinstance(dim, (tuple, list)):
    raise TypeError(f"{name}(): argument 'dim' (position 1) must be int, not {type(dim).__name__}")


def _sqrt0(v: Tensor) -> Tensor:
  zero = v == 0    # PyTorch gives a constant's std a zero gradient, not 0 * inf
  return where(zero, 0.0, where(zero, 1.0, v).sqrt())


def _moments(x: Tensor, axes: tuple, correction=0) -> tuple:
  """(mean, x - mean, variance) over axes, kept as size-1 dims, computed stably: the values are first shifted
  by one of them per output (c), so the sums see deviations of the data's spread rather than its offset (a
  float32 sum of 16384 values near 1000 is off by ~1e-3: the mean, and through it the variance and a
  normalization, inherit that); then the variance is the mean of squared deviations from that mean (two
  passes, never E[x^2] - E[x]^2). The shift's gradient cancels exactly (d/dc of c + mean(x - c) is 0), so
  c is left out of the graph. Still one or two fused kernels: c is a strided read of x."""
  n = prod(x.shape[a] for a in axes)
  c = None
  if n > 1:
    c = Tensor(_node=x._shrink([(0, 1) if i in axes else (0, s) for i, s in enumerate(x.shape)]).node)   # detached
    x = x - c
  # float32 and narrower sum in float64 where the device has it: a float32 accumulator walking thousands of
  # values drifts by ~1e-6 relative (PyTorch's cascade sum does not)
  acc = dt.float64 if x.dtype.itemsize <= 4 and dt.float64 in rd.get(x.device).supported else x.dtype
  md = (x._cast(acc).sum(axes, keepdim=True) / n)._cast(x.dtype) if n else x.sum(axes, keepdim=True) * float("nan")
  dev = x - md
  d64 = dev._cast(acc)
  var = ((d64 * d64).sum(axes, keepdim=True) / builtins.max(n - correction, 0))._cast(x.dtype)
  return (md + c if c is not None else md), dev, var


def _as_bool(o, like: Tensor) -> Tensor:
  return like._operand(o, dt.bool_) if not isinstance(o, Tensor) else o._cast(dt.bool_)


def _windows(x: Tensor, n: int) -> Tensor:
  """x[..., L + n - 1] -> windows [..., L, n] with w[..., i, k] = x[..., i + k] (a view)."""
  from fusegrad.graph.view import View
  L = x.shape[-1] - n + 1
  lead = x.shape[:-1]
  outer = prod(lead)
  flat = x.reshape(outer, x.shape[-1])
  v = View((outer, L, n), (x.shape[-1], 1, 1), 0, None)
  node = gn.make("VIEW", flat.dtype, (flat.node,), v, v.shape, flat.device)
  return flat._prim("WINDOW", n, node).reshape(*lead, L, n)


def _index_in_range(idx: Tensor, n: int, exc: type, message) -> Tensor:
  """Indices that must lie in [0, n), negative ones included (embedding, index_select, gather refuse -1 where x[i]
  wraps it). Values that exist already (a buffer, a constant, a realized tensor) are checked here and refused as
  PyTorch does; a lazy index cannot be checked without running it, so its out-of-range values are sent out of range
  of the data (n), where the gather reads 0: never another element's memory."""
  if idx.node.realized or idx.node.op in ("BUFFER", "CONST"):
    _check_range(idx, n, exc, message)
    return idx
  return where((idx < 0) | (idx >= n), n, idx)


@_trace.check
def _check_range(idx: Tensor, n: int, exc: type, message) -> None:
  vals = idx.numpy()
  if vals.size and (vals.min() < 0 or vals.max() >= n):
    raise exc(message(int(vals.min()) if vals.min() < 0 else int(vals.max())))


# a cumulative sum longer than SCAN_BLOCK_MIN runs in blocks of SCAN_BLOCK elements (_scan_sum)
SCAN_BLOCK_MIN, SCAN_BLOCK = 64, 8


def _scan_sum(x: Tensor, prod: bool = False) -> Tensor:
  """The cumulative sum (product) along the last dim, in x's dtype. Up to SCAN_BLOCK_MIN elements out[..., i] =
  sum_k xpad[..., i + k] over a windowed view with n-1 zeros (ones) in front (one kernel, n^2 operations a row);
  longer, in blocks of SCAN_BLOCK: each block's own running sums, plus the sum of the blocks before it (the blocks'
  totals scanned the same way, recursively): about n * SCAN_BLOCK operations, where the one window did n^2 (a
  [4096, 1024] cumsum: 244 -> 12.5 ms on a 2-core Xeon; its windowed sums run lane by lane, torch's scan 1.6 ms)."""
  n, ident = x.shape[-1], 1 if prod else 0
  if n <= SCAN_BLOCK_MIN:
    w = _windows(x.pad((n - 1, 0), value=ident), n)
    return w.prod(-1)._cast(x.dtype) if prod else w.sum(-1, dtype=x.dtype)   # (sum would widen an integer one)
  b = SCAN_BLOCK
  m = -(-n // b)
  lead = x.shape[:-1]
  xb = (x.pad((0, m * b - n), value=ident) if m * b != n else x).reshape(*lead, m, b)
  inner = _scan_sum(xb, prod)                                        # [..., m, b]: each block's own running sums
  tot = inner[..., -1]                                               # [..., m]: each block's total
  before = _scan_sum(tot[..., :-1], prod).pad((1, 0), value=ident)   # the total of the blocks before each
  out = ((inner * before.unsqueeze(-1)) if prod else (inner + before.unsqueeze(-1))).reshape(*lead, m * b)
  return out[..., :n] if m * b != n else out


def _take_rows(w: Tensor, idx: Tensor) -> Tensor:
  """w[idx] along dim 0 (an embedding lookup): one gather kernel, and a backward that is a matmul
  (one-hot rows) rather than the general gather rule's one-hot over every element. An index whose values exist
  (the caller checked them: _index_in_range) reads its rows directly, position idx * row + column: six nodes made
  here rather than the twenty of indexing's general path (bounds, wrapping, out-of-range guards)."""
  i = idx.node
  if w.ndim == 2 and idx.device == w.device and (i.realized or i.op in ("BUFFER", "CONST")):
    d, dev, row = w.node, w.device, w.shape[1]
    shape = idx.shape + (row,)
    if not d.realized and d.op != "BUFFER": d = gn.contiguous(d)
    i = gn.broadcast(gn.movement(gn.cast(i, dt.int64), "RESHAPE", idx.shape + (1,)), shape)
    col = gn.broadcast(gn.iota(row, dt.int64, dev), shape)
    pos = gn.alu("ADD", gn.alu("MUL", i, gn.const(row, dt.int64, shape, dev)), col)
    out = Tensor(_node=gn.gather(d, pos))
  else:
    with autograd.no_grad(): out = w[idx]
  r = Tensor(_node=out.node)
  autograd.record(r, "TAKE_ROWS", idx, (w,))
  return r


def _transposed_view(t: Tensor) -> bool:
  """Is t a pending view read with stride 1 down its rows and a stride across its columns (`w.T`)? (autograd
  computes such a matmul operand's gradient in the layout of the tensor it views)"""
  n = t.node
  if n.op != "VIEW" or n.realized or n.arg.mask is not None or t.ndim < 2: return False
  st = n.arg.strides
  return st[-2] == 1 and st[-1] not in (0, 1)


def _unfold(x: Tensor, kernel: tuple, stride: tuple, dilation: tuple) -> Tensor:
  """Sliding windows over the last len(kernel) dims (a view, no copy): x[..., *spatial] ->
  w[..., *out, *kernel] with w[..., o, k] = x[..., o * stride + k * dilation] (per dim)."""
  from fusegrad.graph.view import View
  k = len(kernel)
  lead, sp = x.shape[:-k], x.shape[-k:]
  out = tuple((s - d * (kk - 1) - 1) // st + 1 for s, kk, st, d in zip(sp, kernel, stride, dilation))
  if builtins.any(o <= 0 for o in out):
    raise RuntimeError(f"window of size {tuple(kernel)} (dilation {tuple(dilation)}) is larger than the padded input "
                       f"{tuple(sp)}")
  if tuple(stride) == tuple(kernel) and builtins.all(d == 1 for d in dilation):   # tiling windows: a reshape
    y = x
    for i in range(k): y = y.narrow(len(lead) + i, 0, out[i] * kernel[i])
    y = y.reshape(*lead, *[v for o, kk in zip(out, kernel) for v in (o, kk)])
    n = len(lead)
    return y.permute(*range(n), *[n + 2 * i for i in range(k)], *[n + 2 * i + 1 for i in range(k)])
  # over x's own dims (not x reshaped to [prod(lead), *spatial]: a padded x is a masked view that would nest under
  # that reshape, its index a flat position divided back into dims)
  cs = [prod(x.shape[i + 1:]) for i in range(x.ndim)]
  n = len(lead)
  v = View((*lead, *out, *kernel), (*cs[:n], *[c * st for c, st in zip(cs[n:], stride)],
                                    *[c * d for c, d in zip(cs[n:], dilation)]), 0, None)
  node = gn.make("VIEW", x.dtype, (x.node,), v, v.shape, x.device)
  return x._prim("UNFOLD", (tuple(kernel), tuple(stride), tuple(dilation)), node)


def _unfold_flat(x: Tensor, kernel: tuple, steps: tuple, length, inner: int = 1) -> Tensor:
  """Windows along a flat last dim at fixed offsets (a view, no copy): x[B, L] -> w[B, length, *kernel] with
  w[b, p, k] = x[b, p + sum(k_i * steps_i)]. A stride-1 convolution over rows flattened whole reads its input so
  (nn/functional._conv_rows): the output position p is one stride-1 index, whatever the number of spatial dims.
  `length` may instead be the positions as dims, ((n_0, s_0), ..., (n_m, 1)): w[b, o_0, .., o_m, k] = x[b, sum(o_i *
  s_i) + sum(k_i * steps_i)] (a convolution's output rows and columns, the padded row's columns past the output's
  left out; `embed_positions` is the inverse of that layout). With inner > 1 each position holds `inner` consecutive
  values (channels last): x[B, L * inner] -> w[B, length, *kernel, inner], w[b, p, k, c] = x[b, (p + sum(k_i *
  steps_i)) * inner + c]."""
  from fusegrad.graph.view import View
  B, M = x.shape
  L = M // inner
  pos = ((length, 1),) if isinstance(length, int) else tuple(length)
  reach = builtins.sum((n - 1) * s for n, s in pos) + 1 + builtins.sum((k - 1) * s for k, s in zip(kernel, steps))
  if reach > L or M % inner:
    raise RuntimeError(f"internal error: windows of positions {pos} at offsets up to "
                       f"{builtins.sum((k - 1) * s for k, s in zip(kernel, steps))} overrun a row of {L} x {inner}")
  lanes = (inner,) if inner > 1 else ()
  v = View((B, *(n for n, _ in pos), *kernel, *lanes),
           (M, *(s * inner for _, s in pos), *(s * inner for s in steps), *((1,) if lanes else ())), 0, None)
  node = gn.make("VIEW", x.dtype, (x.node,), v, v.shape, x.device)
  return x._prim("UNFOLD_FLAT", (tuple(kernel), tuple(steps), length if isinstance(length, int) else pos, inner), node)


def embed_positions(t: Tensor, dim: int, positions: tuple, length: int) -> Tensor:
  """t with its dims dim .. dim + m (sizes n_i, the positions of _unfold_flat: ((n_0, s_0), .., (n_m, 1)), each
  stride a multiple of the next, at least its size times it) replaced by one flat dim of `length`: position sum(o_i *
  s_i) holds t's element, every other position 0. A gradient over such positions, back in the flat layout."""
  m = len(positions)
  for i in range(m - 1, 0, -1):   # each inner dim padded to its outer dim's stride, then all of them merged
    n, s = positions[i]
    if positions[i - 1][1] % s or positions[i - 1][1] // s < n:
      raise RuntimeError(f"internal error: positions {positions} are no padded layout")
    widths = [(0, 0)] * t.ndim
    widths[dim + i] = (0, positions[i - 1][1] // s - n)
    t = t.pad(tuple(x for w in reversed(widths) for x in w))
  if positions[-1][1] != 1: raise RuntimeError(f"internal error: positions {positions} do not end at stride 1")
  t = t.reshape(*t.shape[:dim], -1, *t.shape[dim + m:])
  flat = t.shape[dim]
  if flat == length: return t
  if flat > length: return t.narrow(dim, 0, length)
  widths = [(0, 0)] * t.ndim
  widths[dim] = (0, length - flat)
  return t.pad(tuple(x for w in reversed(widths) for x in w))


def _check_device_dtype(device: str, d: DType) -> None:
  dev = rd.get(device)
  if d not in dev.supported:
    raise RuntimeError(f"device {device} cannot run dtype {d.name} (supported: "
                       f"{', '.join(sorted(x.name for x in dev.supported))})")


def _to_numpy(data, d: DType | None) -> tuple:
  """data as a numpy array, with the dtype the tensor takes (None: the array's)."""
  if isinstance(data, np.ndarray):
    arr = data
  else:
    try:
      arr = np.array(data)
    except ValueError as e:
      raise ValueError(f"could not build a tensor from {type(data).__name__}: {e}") from None
    except TypeError as e:
      raise TypeError(f"could not build a tensor from {type(data).__name__}: {e}") from None
    if arr.dtype == object or arr.dtype == np.uint64:   # Python ints past int64 (numpy made them uint64 or objects)
      arr = _big_ints(data, arr, d)
    # Python floats: default dtype (numpy float scalars keep theirs, as in torch.tensor)
    if d is None and arr.dtype.kind in "fiu" and isinstance(data, (list, tuple)) and _numpy_leaf(data):
      arr = arr.astype(_list_dtype(data).np)   # a list holding numpy scalars or arrays: theirs promoted, as torch
    elif arr.dtype.kind == "f" and d is None and not isinstance(data, np.generic):
      if dt.default_float is not dt.float64: arr = arr.astype(np.float32)
      if dt.default_float is not dt.float32: d = dt.default_float   # set_default_dtype's (converted below)
    elif arr.dtype.kind in "iu" and d is None and not isinstance(data, np.generic): arr = arr.astype(np.int64)
  if arr.dtype.kind not in "biuf": raise TypeError(f"unsupported numpy dtype {arr.dtype} for a tensor")
  if d is not None and not isinstance(data, np.ndarray): _check_fits(arr, d)   # PyTorch checks Python numbers only
  if d is not None and d != dt.bfloat16:
    with np.errstate(all="ignore"):
      # to float16 through float32, as PyTorch converts (a double is not rounded to 16 bits directly)
      if d == dt.float16 and arr.dtype != np.float16: arr = arr.astype(np.float32)
      arr = arr.astype(d.np)
  elif d is None:
    dt.from_numpy(arr.dtype)   # raises a clear error for uint16 and friends
  return arr, d


def _numpy_leaf(data) -> bool:
  """Does a nested list hold numpy scalars or arrays (then its dtype comes from its elements)? Its first leaf and its
  top level are looked at (a full walk of a long list of Python numbers would cost as much as building it)."""
  if builtins.any(isinstance(x, (np.generic, np.ndarray)) for x in data): return True
  while isinstance(data, (list, tuple)) and data: data = data[0]
  return isinstance(data, (np.generic, np.ndarray))


def _list_dtype(data) -> DType:
  """torch.tensor's dtype of a list: each element's (a Python float the default float, an int int64, a bool bool, a
  numpy scalar or array its own) promoted together."""
  out = None
  stack = [data]
  while stack:
    x = stack.pop()
    if isinstance(x, (list, tuple)): stack.extend(x); continue
    if isinstance(x, (np.generic, np.ndarray)): e = dt.from_numpy(x.dtype)
    elif isinstance(x, builtins.bool): e = dt.bool_
    elif isinstance(x, builtins.int): e = dt.int64
    else: e = dt.default_float
    out = e if out is None else dt.promote_types(out, e)
  return out or dt.default_float


def _big_ints(data, arr: np.ndarray, d: DType | None) -> np.ndarray:
  """Python ints outside int64: a float (or bool) tensor takes them, an integer one cannot (PyTorch's ValueError);
  anything else that numpy made an object array is ragged or not numeric."""
  flat = arr.reshape(-1) if arr.dtype == np.uint64 else None
  if flat is None:
    try:
      flat = np.array(data, dtype=np.float64).reshape(-1)
    except (ValueError, TypeError, OverflowError):
      raise ValueError(f"could not build a tensor from {data!r}: ragged or non-numeric data") from None
  has_float = arr.dtype == object and builtins.any(isinstance(v, (float, np.floating)) for v in arr.reshape(-1))
  if d is not None and (d.is_float or d.is_bool) or d is None and has_float: return np.array(data, dtype=np.float64)
  raise ValueError(f"Overflow when unpacking long long: an integer outside the int64 range [-2**63, 2**63 - 1] "
                   f"cannot make a tensor of dtype {'int64' if d is None else d.name}")


def _check_fits(arr: np.ndarray, d: DType) -> None:
  """PyTorch refuses Python numbers an integer dtype cannot hold (c10::overflows): an integer outside [min, max]
  (for an unsigned type [-max, max]: -1 wraps to 255 as in C), a float outside [min, max], NaN or inf."""
  if not d.is_int or arr.size == 0 or arr.dtype.kind == "b": return
  info = np.iinfo(d.np)
  if arr.dtype.kind == "f":
    hi = float(info.max) if info.bits < 64 else float(np.nextafter(2.0 ** 63, 0))
    with np.errstate(invalid="ignore"): bad = ~((arr >= float(info.min)) & (arr <= hi))
  else:
    lo = -int(info.max) if d.is_unsigned else int(info.min)
    bad = (arr < lo) | (arr > int(info.max))
  if bad.any():
    raise RuntimeError(f"value cannot be converted to type {d.name} without overflow (got {arr[bad].reshape(-1)[0]!r})")


def _host_bits(arr: np.ndarray, d: DType) -> np.ndarray:
  """Host array in the device's storage format (bfloat16 becomes its raw 16 bits)."""
  if d == dt.bfloat16:
    from fusegrad.runtime.python import _bf16_round
    return _bf16_round(arr.astype(np.float32))
  return arr.astype(d.np, copy=False)


def where(condition, input, other) -> Tensor:
  if type(condition) is Tensor and type(input) is Tensor and type(other) is Tensor:   # the common case, directly
    c, a, b = condition.node, input.node, other.node
    if c.dtype is dt.bool_ and a.dtype is b.dtype and c.shape == a.shape == b.shape and c.device == a.device == b.device:
      return input._prim("ALU", "WHERE", gn.alu("WHERE", c, a, b), condition, input, other)
  like = next((t for t in (condition, input, other) if isinstance(t, Tensor)), None)
  if like is None: raise TypeError("where() needs at least one tensor argument")
  cond = condition if isinstance(condition, Tensor) else like._operand(condition, dt.bool_)
  if not isinstance(condition, Tensor) and not _is_scalar(condition): cond = Tensor(condition, device=like.device)
  cond = cond._cast(dt.bool_)
  d = _result_type(*(o for o in (input, other)))
  a = like._operand(input, d) if not isinstance(input, Tensor) else input._cast(d)
  b = like._operand(other, d) if not isinstance(other, Tensor) else other._cast(d)
  for t in (a, b):
    if t.device != cond.device:
      raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                         f"{cond.device} and {t.device}!")
  shape = broadcast_shapes(cond.shape, a.shape, b.shape)
  c, a, b = cond._broadcast_to(shape), a._broadcast_to(shape), b._broadcast_to(shape)
  return a._prim("ALU", "WHERE", gn.alu("WHERE", c.node, a.node, b.node), c, a, b)


# ---- indexing -----------------------------------------------------------------------------------------------

def _getitem(x: Tensor, index, basic_only: bool = False, return_region: bool = False):
  if type(index) is int and x.ndim and not return_region:   # x[i]: the common case, without the general walk
    n = x.shape[0]
    if not -n <= index < n: raise IndexError(f"index {index} is out of bounds for dimension 0 with size {n}")
    i = index + n if index < 0 else index
    return x._shrink([(i, i + 1)] + [(0, s) for s in x.shape[1:]], view=True).reshape(x.shape[1:])
  if not isinstance(index, tuple): index = (index,)
  # expand Ellipsis, count the dims that the index consumes
  consumed = sum(1 for i in index if i is not None and i is not Ellipsis and not (isinstance(i, Tensor) and i.dtype.is_bool)) \
      + sum(i.ndim for i in index if isinstance(i, Tensor) and i.dtype.is_bool)
  if sum(1 for i in index if i is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
  if consumed > x.ndim:
    raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
  full = []
  for i in index:
    if i is Ellipsis: full.extend([slice(None)] * (x.ndim - consumed))
    else: full.append(i)
  if not any(i is Ellipsis for i in index): full.extend([slice(None)] * (x.ndim - consumed))

  # pass 1: basic indexing (ints, slices, None) as views; remember advanced indices
  bounds, steps, flips, out_shape_ops = [], [], [], []
  dim = 0
  adv = []          # (position in the result of the basic pass, index tensor)
  final_dims = []   # how the result of the basic pass maps: ("keep", d) / ("new",) / ("drop", d)
  for i in full:
    if i is None:
      final_dims.append(("new",)); continue
    s = x.shape[dim]
    if isinstance(i, Tensor) and i.dtype.is_bool or isinstance(i, (list, np.ndarray)) and np.asarray(i).dtype == bool:
      if basic_only: raise NotImplementedError("assignment through a boolean mask index inside a tuple index")
      m = i if isinstance(i, Tensor) else Tensor(np.asarray(i), device=x.device)
      for k in range(m.ndim):
        if m.shape[k] != x.shape[dim + k]:
          raise IndexError(f"The shape of the mask {list(m.shape)} at index {k} does not match the shape of the "
                           f"indexed tensor {list(x.shape)} at index {dim + k}")
      nz = np.nonzero(m.numpy())   # data-dependent shape: needs the mask's values now
      for k in range(m.ndim):
        bounds.append((0, x.shape[dim])); steps.append(1)
        adv.append((len([f for f in final_dims if f[0] != "drop"]), Tensor(nz[k].astype(np.int64), device=x.device)))
        final_dims.append(("keep", dim)); dim += 1
      continue
    if isinstance(i, (bool, np.bool_)):
      raise IndexError("indexing with a Python bool is not supported")
    if isinstance(i, (int, np.integer)):
      if not -s <= i < s:
        raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {s}")
      i = int(i) % s
      bounds.append((i, i + 1)); steps.append(1)
      final_dims.append(("drop", dim)); dim += 1
      continue
    if isinstance(i, slice) and type(i.stop) is BoundDim and i.start in (None, 0) and i.step in (None, 1):
      if i.stop > s: raise IndexError(f"slice end {i.stop} ({i.stop.var.name}) exceeds dimension {dim} of size {s}")
      if i.stop.var.hi > s:
        raise IndexError(f"Variable {i.stop.var.name} may reach {i.stop.var.hi}, past dimension {dim} of size {s}")
      bounds.append((0, i.stop)); steps.append(1)   # a runtime size (graph/dims.py)
      final_dims.append(("keep", dim)); dim += 1
      continue
    if isinstance(i, slice):
      start, stop, step = i.indices(s)
      if step == 0: raise ValueError("slice step cannot be zero")
      if step > 0:
        n = builtins.max(0, -(-(stop - start) // step))
        bounds.append((start, start + builtins.max(n - 1, 0) * step + 1) if n else (0, 0)); steps.append(step)
      else:
        n = builtins.max(0, -(-(start - stop) // -step))
        lo = start - (n - 1) * (-step) if n else 0
        bounds.append((lo, start + 1) if n else (0, 0)); steps.append(step)
      final_dims.append(("keep", dim)); dim += 1
      continue
    if isinstance(i, (Tensor, list, tuple, np.ndarray)):
      if basic_only: raise NotImplementedError("assignment through an integer-tensor index is not implemented yet")
      it = i if isinstance(i, Tensor) else Tensor(np.asarray(i), device=x.device)
      if not it.dtype.is_int:
        raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got {it.dtype.name}")
      bounds.append((0, s)); steps.append(1)
      adv.append((len([f for f in final_dims if f[0] != "drop"]), it))
      final_dims.append(("keep", dim)); dim += 1
      continue
    raise IndexError(f"only integers, slices (`:`), ellipsis (`...`), None and integer or boolean tensors are valid "
                     f"indices (got {type(i).__name__})")
  view = not return_region   # basic indexing gives views of x (negative steps too, as numpy's do)
  y = x._shrink(bounds, view=view)
  if any(st < 0 for st in steps):
    flips = tuple(d for d, st in enumerate(steps) if st < 0)
    y = y._view("FLIP", flips) if view else y._mv("FLIP", flips)
  if any(abs(st) != 1 for st in steps):
    strides = tuple(abs(st) for st in steps)
    y = y._view("STRIDE", strides) if view else y._mv("STRIDE", strides)
  shape = []
  for f in final_dims:
    if f[0] == "new": shape.append(1)
    elif f[0] == "keep": shape.append(y.shape[f[1]])
  if return_region:
    return _region(x, bounds, steps, final_dims, tuple(shape))
  y = y.reshape(tuple(shape))
  if not adv: return y
  return _advanced(y, adv)


def _region(x: Tensor, bounds, steps, final_dims, shape):
  """For __setitem__: the indexed region's shape and a function placing values there."""
  def place(val: Tensor):
    inner = tuple(hi - lo if abs(st) == 1 else -(-(hi - lo) // abs(st)) for (lo, hi), st in zip(bounds, steps))
    v = val.reshape(inner)
    mask = Tensor(_node=gn.const(True, dt.bool_, inner, x.device))
    def undo(t: Tensor) -> Tensor:
      if any(abs(st) != 1 for st in steps):
        # spread strided values back: pad each element with step-1 gaps
        for d, st in enumerate(steps):
          k = abs(st)
          if k == 1: continue
          t = t.unsqueeze(d + 1)
          t = t.pad(tuple([0, 0] * (t.ndim - d - 2) + [0, k - 1]))   # (the new dim d + 1: t.ndim - d - 2 after it)
          t = t.flatten(d, d + 1)
          t = t.narrow(d, 0, (inner[d] - 1) * k + 1)
      if any(st < 0 for st in steps): t = t.flip(*[d for d, st in enumerate(steps) if st < 0])
      pads = []
      for (lo, hi), s in zip(reversed(bounds), reversed(x.shape)): pads += [lo, s - hi]
      return t.pad(tuple(pads))
    return undo(v), undo(mask)
  return shape, place


def _advanced(y: Tensor, adv: list, along=None) -> Tensor:
  """Integer-tensor indices on dims of y (positions given): one gather kernel. `along` (dim, index): the gather
  picks index's positions along one dim of y and keeps the others (Tensor.gather), kept for its gradient."""
  positions = [p for p, _ in adv]
  idx = [t.to(y.device) for _, t in adv]
  bshape = broadcast_shapes(*[t.shape for t in idx])
  # bounds check on index values that already exist (a lazy index cannot be checked without running it)
  for p, t in zip(positions, idx):
    if t.node.realized or t.node.op in ("BUFFER", "CONST"):
      vals = t.numpy()
      if vals.size and (vals.min() < -y.shape[p] or vals.max() >= y.shape[p]):
        bad = vals.max() if vals.max() >= y.shape[p] else vals.min()
        raise IndexError(f"index {bad} is out of bounds for dimension {p} with size {y.shape[p]}")
  adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
  rest = [d for d in range(y.ndim) if d not in positions]
  # result layout: advanced dims go where the first one was if adjacent, else to the front
  if adjacent:
    before, after = [d for d in rest if d < positions[0]], [d for d in rest if d > positions[0]]
  else:
    before, after = [], rest
  out_shape = tuple(y.shape[d] for d in before) + bshape + tuple(y.shape[d] for d in after)
  nb = len(before)
  nd_b = len(bshape)
  def place_rest(d: int) -> tuple:
    return (out_shape, nb + nd_b + after.index(d) if d in after else before.index(d))
  # positions in the data's buffer: its storage layout (a runtime size at its bound, graph/dims.py)
  strides = [1] * y.ndim
  acc = 1
  for d, size in reversed(list(enumerate(storage_shape(y.shape)))):
    strides[d] = acc
    acc *= size
  flat, ok = None, None
  for p, t in zip(positions, idx):
    lazy = not (t.node.realized or t.node.op in ("BUFFER", "CONST"))   # unchecked above
    t = t._cast(dt.int64)
    t = where(t < 0, t + y.shape[p], t)
    t = t._broadcast_to(bshape).reshape((1,) * nb + bshape + (1,) * len(after))
    if lazy:
      inside = (t >= 0) & (t < y.shape[p])
      ok = inside if ok is None else ok & inside
    term = t * strides[p]
    flat = term if flat is None else flat + term
  for d in rest:
    _, pos = place_rest(d)
    r = arange(y.shape[d], device=y.device).reshape(*[y.shape[d] if k == pos else 1 for k in range(len(out_shape))])
    flat = flat + r * strides[d]
  if ok is not None:   # an out-of-range lazy index reads 0 (position -1) rather than a neighbouring row's element
    flat = where(ok, flat, -1)
  flat = flat._broadcast_to(out_shape)
  data = y.contiguous()
  return data._prim("GATHER", along, gn.gather(data.node, flat.node), data, flat)


# ---- construction ---------------------------------------------------------------------------------------------

def _dev(device) -> str: return rd.canonical(device)


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  size = _shape_arg((size,) if isinstance(size, (int, np.integer)) else tuple(size))
  if any(s < 0 for s in size): raise RuntimeError(f"Trying to create tensor with negative dimension: {list(size)}")
  d = dt.to_dtype(dtype) if dtype is not None else _result_type(fill_value)
  _check_device_dtype(_dev(device), d)
  if _is_scalar(fill_value) and not isinstance(fill_value, (bool, np.bool_)) and (d.is_int or dtype is None):
    if not isinstance(fill_value, (float, np.floating)) and not -2 ** 63 <= int(fill_value) < 2 ** 63:
      raise ValueError(f"Overflow when unpacking long long: fill value {fill_value} is outside the int64 range")
    _check_fits(np.array([fill_value]), d)
  return Tensor(_node=gn.const(fill_value, d, size, _dev(device)), requires_grad=requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  return full(_shape_arg(size), 0, dtype=dtype or dt.default_float, device=device, requires_grad=requires_grad)


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  return full(_shape_arg(size), 1, dtype=dtype or dt.default_float, device=device, requires_grad=requires_grad)


def empty(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  return zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)


def _like(t: Tensor, dtype, device):
  return dict(dtype=dtype or t.dtype, device=device or t.device)


def zeros_like(t: Tensor, dtype=None, device=None) -> Tensor: return zeros(t.shape, **_like(t, dtype, device))
def ones_like(t: Tensor, dtype=None, device=None) -> Tensor: return ones(t.shape, **_like(t, dtype, device))
def empty_like(t: Tensor, dtype=None, device=None) -> Tensor: return zeros(t.shape, **_like(t, dtype, device))
def full_like(t: Tensor, fill_value, dtype=None, device=None) -> Tensor:
  return full(t.shape, fill_value, **_like(t, dtype, device))
def rand_like(t: Tensor, dtype=None, device=None) -> Tensor: return rand(t.shape, **_like(t, dtype, device))
def randn_like(t: Tensor, dtype=None, device=None) -> Tensor: return randn(t.shape, **_like(t, dtype, device))


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  # 0-d tensors as bounds: their values, an integer tensor's as an int (torch's arange(tensor(5)) is int64)
  start, end, step = (v.item() if isinstance(v, Tensor) else v for v in (start, end, step))
  if end is None: start, end = 0, start
  if step == 0: raise RuntimeError("step must be nonzero")
  n = builtins.max(0, math.ceil((end - start) / step))
  if type(end) is BoundDim and start == 0 and step == 1: n = end   # a runtime length (graph/dims.py)
  if (end - start) / step < 0 and n == 0 and end != start:
    raise RuntimeError(f"upper bound and larger bound inconsistent with step sign (start={start}, end={end}, step={step})")
  is_int = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, end, step))
  d = dt.to_dtype(dtype) if dtype is not None else (dt.int64 if is_int else dt.default_float)
  dev = _dev(device)
  _check_device_dtype(dev, d)
  i = Tensor(_node=gn.iota(n, dt.int64 if d.is_int else d, dev))
  out = (i * step + start) if (step != 1 or start != 0) else i
  out = out._cast(d)
  if requires_grad: out.requires_grad_()
  return out


def linspace(start, end, steps: int, dtype=None, device=None) -> Tensor:
  if steps < 0: raise RuntimeError("number of steps must be non-negative")
  d = dt.to_dtype(dtype) if dtype is not None else dt.default_float
  if steps == 1: return full((1,), start, dtype=d, device=device)
  step = (end - start) / builtins.max(steps - 1, 1)
  i = arange(steps, device=device, dtype=dt.float64 if d == dt.float64 else dt.float32)
  # symmetric, as PyTorch computes it: the second half counts back from the end
  out = where(i < steps // 2, start + i * step, end - (steps - 1 - i) * step)
  return out._cast(d)


def eye(n: int, m: int | None = None, dtype=None, device=None) -> Tensor:
  m = n if m is None else m
  i = arange(n, device=device).reshape(n, 1)
  j = arange(m, device=device).reshape(1, m)
  return (i == j)._cast(dt.to_dtype(dtype) if dtype is not None else dt.default_float)


# ---- random numbers: a counter-based generator computed inside the kernels ---------------------------------

class _RNG:
  seed = 0
  counter = 0


class Generator:
  """A random-number generator of its own (torch.Generator): the same counter-based draws as the global one
  (`fusegrad.manual_seed`), from its own (seed, counter); pass it as `generator=` to rand, randn, randint,
  randperm, multinomial, random_split and the samplers. One generator serves every device."""

  def __init__(self, device=None):
    self.device = device
    self._state = _RNG()   # instance attributes shadow _RNG's class ones: (seed, counter) of this generator
    self._state.seed, self._state.counter = 67280421310721, 0   # torch's default seed for a fresh generator
    self._initial = self._state.seed

  def manual_seed(self, seed: int) -> "Generator":
    self._state.seed, self._state.counter = int(seed) & 0xFFFFFFFFFFFFFFFF, 0
    self._initial = self._state.seed
    return self

  def initial_seed(self) -> int: return self._initial

  def seed(self) -> int:
    """Reseed from the clock (nondeterministic) and return the new seed, as torch.Generator.seed does."""
    import time
    return self.manual_seed(time.time_ns()).initial_seed()


def _gen(generator):
  """The (seed, counter) holder that draws advance: the global one, or a Generator's own."""
  if generator is None: return _RNG
  if not isinstance(generator, Generator):
    raise TypeError(f"generator must be a fusegrad.Generator, got {type(generator).__name__}")
  return generator._state


def manual_seed(seed: int) -> None:
  seed = int(seed) & 0xFFFFFFFFFFFFFFFF
  def set_seed(): _RNG.seed, _RNG.counter = seed, 0
  _jit.host(set_seed)   # inside a captured step (fusegrad.jit), every replay seeds again


def seed() -> int:
  import time
  manual_seed(time.time_ns())
  return _RNG.seed


def _mix32(x: Tensor) -> Tensor:
  """A 32-bit avalanche hash (lowbias32); uint32 arithmetic wraps on every device alike."""
  x = x ^ (x >> 16)
  x = x * 0x7FEB352D
  x = x ^ (x >> 15)
  x = x * 0x846CA68B
  return x ^ (x >> 16)


def _random_bits(n: int, device: str, generator=None) -> Tensor:
  """n uniformly distributed uint32 values from (seed, counter) of `generator` (default: the global one);
  advances its counter."""
  return _hash_bits(_draw_keys(_gen(generator), n, device), n)


def _draw_keys(g, n: int, device: str) -> Tensor:
  """A buffer of the keys of n draws from holder g (advancing its counter), written on the host. A replayed step
  (engine/trace.py) draws through here too, or is handed the keys it drew (`trace.drawn`)."""
  keys = _trace.drawn(g, n, device)
  if keys is not None: return keys
  # the keys travel as a buffer, so the kernel is the same for every call and compiles once (and a captured
  # step, fusegrad.jit, draws new keys at every replay)
  keys = Tensor(_node=gn.buffer_node(rd.Buffer(rd.get(device), 3, dt.uint32), dt.uint32, (3,), device))
  def draw():
    s = g.seed
    k0 = (s ^ (s >> 32) ^ 0x9E3779B9) & 0xFFFFFFFF
    k1 = (g.counter * 0x632BE5AB + 0x85EBCA6B) & 0xFFFFFFFF
    k2 = (g.counter >> 32) & 0xFFFFFFFF
    g.counter += n
    keys.node.buffer.copyin(np.array([k0, k1, k2 ^ 0x27D4EB2F], dtype=np.uint32))
  _jit.host(draw)
  _trace.note_draw(g, n, device, keys)
  return keys


@templated
def _hash_bits(keys: Tensor, n: int) -> Tensor:
  """The n values of a counter-based draw from its keys (the draw's host part is _random_bits': made from a
  template after the first call, since its ~40 ops are the same for every draw of n)."""
  i = Tensor(_node=gn.iota(n, dt.uint32, keys.device))
  ka, kb, kc = (keys[j].reshape(1).expand(n) for j in range(3))
  h = _mix32(i ^ ka)
  h = _mix32(h + kb)
  return _mix32(h ^ kc)


@templated
def _uniform(bits: Tensor, size: tuple, d: DType) -> Tensor:
  """uint32 bits -> uniform values in [0, 1) of dtype d, shaped size: as many bits as d's significand holds below 1
  (24: every float32 value exact; float16 11, bfloat16 8, as torch's), so no value rounds up to 1.0 in d."""
  m = {"float16": 11, "bfloat16": 8}.get(d.name, 24)
  u = (bits >> (32 - m))._cast(dt.float32) * (1.0 / (1 << m))
  return u._cast(d).reshape(size)


@templated
def _normal(bits: Tensor, size: tuple, d: DType) -> Tensor:
  """2 x n uint32 bits -> n standard normal values of dtype d, shaped size (Box-Muller)."""
  n = bits.shape[0] // 2
  u = (bits.reshape(2, n) >> 8)._cast(dt.float32) * (1.0 / (1 << 24))
  u1, u2 = 1.0 - u[0], u[1]     # u1 in (0, 1]: log is finite
  z = (-2.0 * u1.log()).sqrt() * (2 * math.pi * u2).cos()
  return z._cast(d).reshape(size)


def rand(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  size = _shape_arg(size)
  d = dt.to_dtype(dtype) if dtype is not None else dt.default_float
  if not d.is_float: raise TypeError(f"rand() expects a floating point dtype, got {d.name}")
  dev = _dev(device)
  out = _uniform(_random_bits(prod(size), dev, generator), tuple(size), d)
  if requires_grad: out.requires_grad_()
  return out


def randn(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
  size = _shape_arg(size)
  d = dt.to_dtype(dtype) if dtype is not None else dt.default_float
  if not d.is_float: raise TypeError(f"randn() expects a floating point dtype, got {d.name}")
  dev = _dev(device)
  out = _normal(_random_bits(2 * prod(size), dev, generator), tuple(size), d)
  if requires_grad: out.requires_grad_()
  return out


def randint(low, high=None, size=None, generator=None, dtype=None, device=None) -> Tensor:
  if high is None: low, high = 0, low
  if size is None: raise TypeError("randint() missing required argument 'size'")
  if high <= low: raise RuntimeError(f"random_ from {low} to {high} is empty")
  size = _shape_arg(tuple(size) if not isinstance(size, int) else (size,))
  dev = _dev(device)
  n = prod(size)
  span = high - low
  if span < (1 << 31):   # multiply-shift: exact integer arithmetic, no float64 needed
    out = (_random_bits(n, dev, generator)._cast(dt.int64) * span >> 32) + low
  else:
    b = _random_bits(2 * n, dev, generator).reshape(2, n)._cast(dt.int64)
    out = ((b[0] << 31) ^ b[1]) % span + low
  return out._cast(dt.to_dtype(dtype) if dtype is not None else dt.int64).reshape(size)


def randperm(n: int, generator=None, device=None, dtype=None) -> Tensor:
  keys = rand(n, generator=generator, device=device)
  return keys.argsort()._cast(dt.to_dtype(dtype) if dtype is not None else dt.int64)


# ---- joining and contracting ---------------------------------------------------------------------------------

def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
  if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)) and not hasattr(tensors, "__iter__"):
    raise TypeError(f"cat() argument 'tensors' (position 1) must be tuple of Tensors, not {type(tensors).__name__}")
  tensors = [t for t in tensors]
  for i, t in enumerate(tensors):
    if not isinstance(t, Tensor):
      raise TypeError(f"expected Tensor as element {i} in argument 0, but got {type(t).__name__}")
  if not tensors: raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
  # PyTorch skips 1-D empty tensors in cat, but for the result's dtype
  every = tensors
  ref = next((t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)), tensors[0])
  tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or [ref]
  d = _norm_dim(dim, ref.ndim)
  for i, t in enumerate(tensors):
    if t.ndim != ref.ndim:
      raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.ndim} and {t.ndim} "
                         f"(tensor number {i} in the list has shape {list(t.shape)})")
    if any(a != b for k, (a, b) in enumerate(zip(t.shape, ref.shape)) if k != d):
      raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size "
                         f"{[s for k, s in enumerate(ref.shape) if k != d]} but got size "
                         f"{[s for k, s in enumerate(t.shape) if k != d]} for tensor number {i} in the list.")
    if t.device != ref.device:
      raise RuntimeError(f"Expected all tensors to be on the same device, but found {ref.device} and {t.device}")
  out_d = every[0].dtype
  for t in every[1:]: out_d = dt.promote_types(out_d, t.dtype)
  total = sum(t.shape[d] for t in tensors)
  out, start = None, 0
  for t in tensors:
    pad = [0, 0] * (ref.ndim - d - 1) + [start, total - start - t.shape[d]]
    t = t._cast(out_d)
    # the parts padded and added up. A float part is padded with -0.0 (negated, padded with 0, negated back): x +
    # -0.0 is x for every x, where a padding of +0.0 turned another part's -0.0 into +0.0 (PyTorch's cat keeps it)
    p = -(-t).pad(tuple(pad)) if out_d.is_float and len(tensors) > 1 else t.pad(tuple(pad))
    out = p if out is None else (out | p if out_d.is_bool else out + p)
    start += t.shape[d]
  return out


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
  if isinstance(tensors, Tensor):
    raise TypeError("stack(): argument 'tensors' (position 1) must be tuple of Tensors, not Tensor")
  tensors = list(tensors)
  for i, t in enumerate(tensors):
    if not isinstance(t, Tensor):
      raise TypeError(f"expected Tensor as element {i} in argument 0, but got {type(t).__name__}")
  if not tensors: raise RuntimeError("stack expects a non-empty TensorList")
  for i, t in enumerate(tensors):
    if t.shape != tensors[0].shape:
      raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} at entry 0 "
                         f"and {list(t.shape)} at entry {i}")
  d = _norm_dim(dim, tensors[0].ndim + 1)
  return cat([t.unsqueeze(d) for t in tensors], d)


def einsum(equation: str, *operands) -> Tensor:
  if len(operands) == 1 and isinstance(operands[0], (list, tuple)): operands = tuple(operands[0])
  eq = equation.replace(" ", "")
  lhs, arrow, rhs = eq.partition("->")
  ins = lhs.split(",")
  if len(ins) != len(operands):
    raise ValueError(f"einsum(): {len(ins)} operands in the equation but {len(operands)} tensors given")
  # expand '...' into fresh upper-case-free letters
  ell_letters = "".join(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq)
  nell = 0
  terms = []
  for term, t in zip(ins, operands):
    if "..." in term:
      k = t.ndim - (len(term) - 3)
      nell = builtins.max(nell, k)
      term = term.replace("...", ell_letters[nell - k:nell] if k else "")
    if len(term) != t.ndim:
      raise ValueError(f"einsum(): the term {term!r} has {len(term)} subscripts but its operand has {t.ndim} dims")
    terms.append(term)
  if arrow:
    out = rhs.replace("...", ell_letters[:nell])
  else:
    counts = {}
    for term in terms:
      for c in term: counts[c] = counts.get(c, 0) + 1
    out = ell_letters[:nell] + "".join(sorted(c for c in counts if counts[c] == 1 and c not in ell_letters))
  letters = list(dict.fromkeys("".join(terms) + out))
  sizes = {}
  for term, t in zip(terms, operands):
    for c, s in zip(term, t.shape):
      if c in sizes and sizes[c] != s and s != 1 and sizes[c] != 1:
        raise RuntimeError(f"einsum(): operands do not broadcast with remapped shapes: subscript {c!r} has size "
                           f"{s} for one operand and {sizes[c]} for another")
      if c not in sizes or sizes[c] == 1: sizes[c] = s   # a size-1 dim broadcasts (and an empty one stays empty)
  for c in out:
    if c not in sizes: raise ValueError(f"einsum(): output subscript {c!r} does not appear in the input")
  full_ = None
  for term, t in zip(terms, operands):
    # diagonal: repeated letters in one term
    for c in set(term):
      while term.count(c) > 1:
        i, j = term.index(c), term.index(c, term.index(c) + 1)
        n = t.shape[i]
        t = t.movedim(j, -1).movedim(i if i < j else i - 1, -1)
        t = t.reshape(*t.shape[:-2], n * n)[..., ::n + 1]
        term = "".join(x for k, x in enumerate(term) if k not in (i, j)) + c
    order = [term.index(c) for c in letters if c in term]
    t = t.permute(*order)
    own = iter(t.shape)
    t = t.reshape(*[next(own) if c in term else 1 for c in letters])   # its own sizes: 1s broadcast below
    full_ = t if full_ is None else full_ * t
  red = [i for i, c in enumerate(letters) if c not in out]
  res = full_._broadcast_to(tuple(sizes[c] for c in letters))
  if red: res = res.sum(tuple(red))
  kept = [c for c in letters if c in out]
  return res.permute(*[kept.index(c) for c in out]) if kept else res


def _movedim(self: Tensor, source, destination) -> Tensor:
  """movedim(int, int) or movedim(tuple, tuple): the source dims land at the destination positions, the other
  dims keep their order in the remaining places."""
  src = (source,) if isinstance(source, (int, np.integer)) else tuple(source)
  dst = (destination,) if isinstance(destination, (int, np.integer)) else tuple(destination)
  if len(src) != len(dst):
    raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain the "
                       f"same number of dims as destination ({list(dst)} dims)")
  s, d = _norm_dims(src, self.ndim), _norm_dims(dst, self.ndim)
  if self.ndim == 0: return self
  order = [None] * self.ndim
  for a, b in zip(s, d): order[b] = a
  rest = iter(i for i in range(self.ndim) if i not in s)
  return self.permute(*[o if o is not None else next(rest) for o in order])


Tensor.movedim = _movedim
Tensor.moveaxis = _movedim


def _before(a: Tensor, b: Tensor, descending: bool) -> Tensor:
  """Does b sort before a? PyTorch's order: NaN is greater than everything (last ascending, first descending)."""
  lt = (a < b) if descending else (b < a)
  if not a.dtype.is_float: return lt
  na, nb = a.isnan(), b.isnan()
  return (lt | (nb & na.logical_not())) if descending else (lt | (na & nb.logical_not()))


def _sort_perm(x: Tensor, descending: bool) -> Tensor:
  """The stable sorting permutation along the last dim, by counting (O(n^2) compares, fully fused):
  rank[i] = #{j : x[j] sorts before x[i]} + #{j < i : x[j] ties x[i]}, then the inverse permutation."""
  n = x.shape[-1]
  a = x.unsqueeze(-1)      # [..., i, 1]
  b = x.unsqueeze(-2)      # [..., 1, j]
  i = arange(n, device=x.device)
  eq = (b == a) | (b.isnan() & a.isnan()) if x.dtype.is_float else (b == a)   # -0.0 ties 0.0, NaN ties NaN
  tie = eq & (i.reshape(1, n) < i.reshape(n, 1))
  rank = (_before(a, b, descending) | tie).sum(-1)     # rank of element i
  onehot = rank.unsqueeze(-1) == i   # [..., i, r]: position r holds the i whose rank is r
  return (onehot._cast(dt.int64) * i.reshape(n, 1)).sum(-2)


def _argsort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
  """Always stable (equal values keep their order); NaN sorts as the largest value, as in PyTorch."""
  d = _norm_dim(dim, self.ndim)
  if self.ndim == 0: return Tensor(_node=gn.const(0, dt.int64, (), self.device))
  return _sort_perm(self.transpose(d, -1), descending).transpose(d, -1)


ReturnSort = namedtuple("sort", ["values", "indices"])
ReturnTopk = namedtuple("topk", ["values", "indices"])
ReturnKth = namedtuple("kthvalue", ["values", "indices"])


def _sort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
  idx = _argsort(self, dim, descending)
  return ReturnSort(self.gather(_norm_dim(dim, self.ndim), idx) if self.ndim else self, idx)


def _msort(self: Tensor) -> Tensor: return _sort(self, 0).values


def _topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
  """The k largest (smallest) along dim, sorted; NaN counts as the largest value, as in PyTorch."""
  d = _norm_dim(dim, self.ndim)
  n = self.shape[d] if self.ndim else 1
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)): raise TypeError(f"topk(): k must be an int, got {type(k).__name__}")
  if not 0 <= k <= n: raise RuntimeError(f"selected index k out of range (k={k}, dimension {d} has size {n})")
  vals, idx = _sort(self, d, descending=largest)
  if self.ndim == 0: return ReturnTopk(vals, idx)
  return ReturnTopk(vals.narrow(d, 0, k), idx.narrow(d, 0, k))


def _kthvalue(self: Tensor, k: int, dim: int = -1, keepdim: bool = False):
  """The k-th smallest value (1-based) along dim and its index; NaN counts as the largest value."""
  d = _norm_dim(dim, self.ndim)
  n = self.shape[d] if self.ndim else 1
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
    raise TypeError(f"kthvalue(): k must be an int, got {type(k).__name__}")
  if not 1 <= k <= n: raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d} (k={k}, size {n})")
  vals, idx = _sort(self, d)
  if self.ndim == 0: return ReturnKth(vals, idx)
  v, i = vals.narrow(d, k - 1, 1), idx.narrow(d, k - 1, 1)
  return ReturnKth(v, i) if keepdim else ReturnKth(v.squeeze(d), i.squeeze(d))


Tensor.argsort = _argsort
Tensor.sort = _sort
Tensor.msort = _msort
Tensor.topk = _topk
Tensor.kthvalue = _kthvalue


# ---- sampling and *_like constructors that PyTorch programs use -----------------------------------------

def randint_like(input: Tensor, low: int = 0, high: int | None = None, *, dtype=None, device=None,
                 generator=None) -> Tensor:
  """randint_like(input, high) or randint_like(input, low, high), as PyTorch spells it."""
  if high is None: low, high = 0, low
  return randint(low, high, input.shape, generator=generator, dtype=dtype or input.dtype, device=device or input.device)


_NO_REPLACEMENT_ARGSORT = 4096   # without replacement and more than a few samples: one O(n^2) argsort up to this n


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
  """Indices drawn from the categories of each row of `input` (1-D or 2-D; non-negative weights that need not
  sum to one), int64 of shape (num_samples,) or (rows, num_samples), as torch.multinomial.

  Exponential races: category i of a row wins with key E_i / p_i smallest (E_i ~ Exp(1) from fusegrad's
  counter-based generator), which is category i with probability p_i / sum(p). With replacement each sample
  runs its own race (one fused kernel: the random keys and the arg-min); without replacement one race per row,
  and the samples are its first `num_samples` finishers, which is sequential sampling without replacement.
  The weights are checked as PyTorch checks them (a host read of two flags: the input is realized first)."""
  if not isinstance(input, Tensor): raise TypeError(f"multinomial(): input must be a Tensor, got {type(input).__name__}")
  if not input.dtype.is_float:
    raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {input.dtype.name}")
  if input.ndim not in (1, 2):
    raise RuntimeError(f"prob_dist must be 1 or 2 dim, got a {input.ndim}-D tensor of shape {list(input.shape)}")
  if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
    raise TypeError(f"multinomial(): num_samples must be an int, got {type(num_samples).__name__}")
  k, n = int(num_samples), input.shape[-1]
  if k <= 0: raise RuntimeError("cannot sample n_sample <= 0 samples")
  if not replacement and k > n:
    raise RuntimeError(f"cannot sample n_sample > prob_dist.size(-1) samples without replacement "
                       f"(n_sample={k}, prob_dist.size(-1)={n})")
  rows = input.shape[0] if input.ndim == 2 else 1
  with autograd.no_grad():
    p = input.detach().reshape(rows, n)
    p = p._cast(dt.float64 if p.dtype == dt.float64 else dt.float32).contiguous().realize()
    flags = stack([(p.isfinite().logical_not() | (p < 0)).any(), (p.sum(-1) <= 0).any()]).numpy()
    if flags[0]: raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if flags[1]: raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    q = (p / p.amax(-1, keepdim=True))._cast(dt.float32)   # in (0, 1] where positive: E / q stays finite
    if replacement:
      # a [rows, chunk, n] race per chunk of samples keeps the random keys of one kernel bounded
      chunk = builtins.max(1, (1 << 24) // builtins.max(rows * n, 1))
      parts = []
      for start in range(0, k, chunk):
        m = builtins.min(chunk, k - start)
        e = -(1.0 - rand(rows, m, n, generator=generator, device=p.device)).log()   # Exp(1); 1 - u is in (0, 1]
        parts.append(where(q.unsqueeze(1) > 0, e / q.unsqueeze(1), math.inf).argmin(-1))
      out = parts[0] if len(parts) == 1 else cat(parts, 1)
    else:
      e = -(1.0 - rand(rows, n, generator=generator, device=p.device)).log()
      # finite keys: positive weights first, then zero weights (PyTorch also returns those once the positive
      # ones are used up); a chosen category's key becomes inf, so samples stay distinct
      key = where(q > 0, (e / q).minimum(1e38), 2e38)
      if k == 1: out = key.argmin(-1, keepdim=True)
      elif n <= _NO_REPLACEMENT_ARGSORT: out = key.argsort(-1)[:, :k]
      else:
        # k rounds over realized keys: the same two small kernels every round, compiled once (a lazy chain
        # would make k growing kernels, each compiled anew)
        key, ids, picks = key.realize(), arange(n, device=p.device).reshape(1, n), []
        for _ in range(k):
          i = key.argmin(-1, keepdim=True).realize()
          picks.append(i)
          key = where(ids == i, math.inf, key).realize()
        out = cat(picks, 1)
    out = out._cast(dt.int64)
  return out.reshape(k) if input.ndim == 1 else out
