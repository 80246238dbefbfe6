"""The op table: every primitive op the graph and the kernels know, with its arity and its numpy
meaning (the reference the PYTHON device runs and the tests trust).

Renderers keep their own spelling tables keyed by these same names; autograd (later) keeps its
rules keyed by them too. The frontend composes everything else (gelu, softmax, floor division…)
from these, so a backend implements only this list.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
import numpy as np


@dataclass(frozen=True)
class OpInfo:
  name: str
  arity: int
  ref: Callable           # numpy implementation on arrays of the result's dtype (CAST gets the dtype)
  float_only: bool = False
  bool_result: bool = False


def _np_err(f):
  def g(*a):
    with np.errstate(all="ignore"): return f(*a)
  return g


def _idiv(a, b):
  """C-style truncating integer division; x/0 gives 0 rather than trapping."""
  with np.errstate(all="ignore"):
    b_safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(b_safe)
    q = np.where((a < 0) != (b_safe < 0), -q, q)
    return np.where(b == 0, 0, q).astype(np.result_type(a, b))


def _imod(a, b):
  """C-style remainder (sign of the dividend); x%0 gives 0."""
  with np.errstate(all="ignore"):
    b_safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, a - _idiv(a, b_safe) * b_safe).astype(np.result_type(a, b))


def _div(a, b):
  if np.issubdtype(np.asarray(a).dtype, np.integer): return _idiv(a, b)
  with np.errstate(all="ignore"): return np.true_divide(a, b).astype(np.result_type(a, b))


def _mod(a, b):
  if np.issubdtype(np.asarray(a).dtype, np.integer): return _imod(a, b)
  with np.errstate(all="ignore"): return np.fmod(a, b)


def _max(a, b):
  return np.maximum(a, b)  # propagates NaN, like torch.maximum


def _shift(f):
  """A shift by a count outside [0, bits) as torch's: 0, and for a right shift of a negative signed value -1 (its
  sign filled in)."""
  def g(a, b):
    a = np.asarray(a)
    bits = a.dtype.itemsize * 8
    out = np.where(a < 0, -1, 0).astype(a.dtype) if f is np.right_shift and np.issubdtype(a.dtype, np.signedinteger) \
        else 0
    with np.errstate(all="ignore"):
      return np.where((b < 0) | (b >= bits), out, f(a, np.clip(b, 0, bits - 1).astype(a.dtype)))
  return g


def _erf(x):
  from math import erf
  return np.vectorize(erf, otypes=[np.asarray(x).dtype])(x) if np.asarray(x).size else np.asarray(x)


UNARY = {
  "NEG": OpInfo("NEG", 1, np.negative),
  "EXP": OpInfo("EXP", 1, _np_err(np.exp), True),
  "LOG": OpInfo("LOG", 1, _np_err(np.log), True),
  "SQRT": OpInfo("SQRT", 1, _np_err(np.sqrt), True),
  "SIN": OpInfo("SIN", 1, _np_err(np.sin), True),
  "COS": OpInfo("COS", 1, _np_err(np.cos), True),
  "TAN": OpInfo("TAN", 1, _np_err(np.tan), True),
  "TANH": OpInfo("TANH", 1, _np_err(np.tanh), True),
  "ERF": OpInfo("ERF", 1, _erf, True),
  "ATAN": OpInfo("ATAN", 1, _np_err(np.arctan), True),   # the inverse trig/hyperbolic functions compose from it
  "ABS": OpInfo("ABS", 1, np.abs),
  "FLOOR": OpInfo("FLOOR", 1, np.floor, True),
  "CEIL": OpInfo("CEIL", 1, np.ceil, True),
  "RINT": OpInfo("RINT", 1, np.rint, True),       # round half to even, as torch.round
  "TRUNC": OpInfo("TRUNC", 1, np.trunc, True),
  "RECIP": OpInfo("RECIP", 1, _np_err(np.reciprocal), True),
  "ISNAN": OpInfo("ISNAN", 1, np.isnan, True, True),
  "NOT": OpInfo("NOT", 1, np.invert),              # bitwise on ints, logical on bool
}

BINARY = {
  "ADD": OpInfo("ADD", 2, _np_err(np.add)),
  "SUB": OpInfo("SUB", 2, _np_err(np.subtract)),
  "MUL": OpInfo("MUL", 2, _np_err(np.multiply)),
  "DIV": OpInfo("DIV", 2, _div),                   # true division on floats, truncating on ints
  "MOD": OpInfo("MOD", 2, _mod),                   # C fmod / % (sign of the dividend)
  "MAX": OpInfo("MAX", 2, _max),
  "MIN": OpInfo("MIN", 2, np.minimum),
  "POW": OpInfo("POW", 2, _np_err(np.power), True),
  "ATAN2": OpInfo("ATAN2", 2, _np_err(np.arctan2), True),
  "CMPLT": OpInfo("CMPLT", 2, np.less, False, True),
  "CMPLE": OpInfo("CMPLE", 2, np.less_equal, False, True),
  "CMPEQ": OpInfo("CMPEQ", 2, np.equal, False, True),
  "CMPNE": OpInfo("CMPNE", 2, np.not_equal, False, True),
  "AND": OpInfo("AND", 2, np.bitwise_and),
  "OR": OpInfo("OR", 2, np.bitwise_or),
  "XOR": OpInfo("XOR", 2, np.bitwise_xor),
  "SHL": OpInfo("SHL", 2, _shift(np.left_shift)),
  "SHR": OpInfo("SHR", 2, _shift(np.right_shift)),
}

TERNARY = {"WHERE": OpInfo("WHERE", 3, np.where)}

ALU = {**UNARY, **BINARY, **TERNARY}

# conversions: elementwise like the ALU ops, one source, the result's dtype given by the node. CAST converts the value
# (C's and PyTorch's .to), BITCAST reads the source's bits as a dtype of the same size (PyTorch's view(dtype); a
# bool's byte reads as x != 0). Their numpy meanings take the dtypes: runtime/python.py
CONVERT = frozenset({"CAST", "BITCAST"})
ELEMENTWISE = frozenset(ALU) | CONVERT

# reductions: identity element and numpy meaning (over the given axes, keepdims)
REDUCE = {
  "SUM": (0, np.sum),
  "PROD": (1, np.prod),
  "MAX": ("min", np.max),   # identity is the dtype's minimum (-inf for floats)
  "MIN": ("max", np.min),
}

# movement ops (views): see graph/view.py
MOVEMENT = ("RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "STRIDE")
