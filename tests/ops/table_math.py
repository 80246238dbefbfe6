"""The operator matrix's math side: elementwise ops, reductions, cumulative ops, sorting, comparison, matmul,
einsum and torch.linalg basics (tests/ops/spec.py describes the format; tests/ops/test_matrix.py runs it).

Left out of torch.linalg (fusegrad/linalg.py says why): eig/eigh/svd/lstsq/pinv/qr, the 2/-2/'nuc' matrix norms and
complex results. det/inv/solve/cholesky are tested on small well-conditioned matrices (n <= 4).
"""
from __future__ import annotations
from dataclasses import replace
import numpy as np
from spec import OpCase

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int8", "int16", "int32", "int64", "uint8")
F32 = ("float32",)
F32_64 = ("float32", "float64")

# shape variants
U = (((3, 4),), ((),), ((0, 3),), ((2, 1, 5),))
B = (((3, 4), (3, 4)), ((3, 1), (1, 4)), ((), (2, 3)), ((0, 3), (1, 3)), ((2, 3, 4), (4,)))
T3 = (((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), ()), ((0, 2), (0, 2), (2,)))
R = (((3, 4, 5),), ((4, 6),))
R0 = (((3, 4, 5),), ((),), ((0, 4),))
C = (((4, 5),), ((3, 4, 2),), ((6,),), ((),), ((0, 3),))


def _zeros_in(rng, shape, dtype):
  """uniform in [-2, 2) with about a third of the values exactly 0 (pow's gradient at 0)"""
  a = rng.uniform(-2, 2, size=shape)
  return np.where(rng.random(shape) < 0.35, 0.0, a)


def _pos_zeros(rng, shape, dtype):
  a = rng.uniform(0.2, 2, size=shape)
  return np.where(rng.random(shape) < 0.35, 0.0, a)


def _ties(rng, shape, dtype):
  """a few distinct values: ties for mode/unique/median"""
  return rng.integers(-2, 3, size=shape).astype(np.float64 if dtype not in ("bool",) else bool)


def _spd(rng, shape, dtype):
  """symmetric positive definite (batched): A A^T + n I"""
  a = rng.uniform(-1, 1, size=shape)
  n = shape[-1]
  return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _wellcond(rng, shape, dtype):
  """a well-conditioned square matrix (batched): random plus a dominant diagonal"""
  return rng.uniform(-1, 1, size=shape) + 3 * np.eye(shape[-2], shape[-1])


CASES: list[OpCase] = []


def add(name, fn, shapes, dtypes=F32, **kw):
  CASES.append(OpCase(name, fn, shapes, dtypes, **kw))


# ---- elementwise unary --------------------------------------------------------------------------------------

UNARY = {   # name: (low, high, fast, extra dtypes)
  "neg": (-2, 2, True, INTS), "exp": (-3, 3, True, ()), "exp2": (-3, 3, False, ()), "expm1": (-3, 3, False, ()),
  "log": (0.1, 4, True, ()), "log2": (0.1, 4, False, ()), "log10": (0.1, 4, False, ()), "log1p": (-0.9, 4, False, ()),
  "sqrt": (0.1, 4, True, ()), "rsqrt": (0.1, 4, False, ()), "sin": (-3, 3, True, ()), "cos": (-3, 3, False, ()),
  "tan": (-1.2, 1.2, False, ()), "tanh": (-3, 3, False, ()), "erf": (-2, 2, False, ()), "abs": (-2, 2, True, INTS),
  "sign": (-2, 2, False, INTS), "reciprocal": (0.2, 3, False, ()), "sigmoid": (-4, 4, False, ()),
  "relu": (-2, 2, False, ("int32",)), "floor": (-3, 3, False, ("int32",)), "ceil": (-3, 3, False, ()),
  "round": (-3, 3, False, ()), "trunc": (-3, 3, False, ()), "frac": (-3, 3, False, ()), "square": (-2, 2, False, INTS),
  "asin": (-0.95, 0.95, True, ()), "acos": (-0.95, 0.95, True, ()), "atan": (-4, 4, True, ()),
  "sinh": (-3, 3, True, ()), "cosh": (-3, 3, True, ()), "asinh": (-4, 4, True, ()), "acosh": (1.05, 4, True, ()),
  "atanh": (-0.95, 0.95, True, ()), "erfc": (-2, 2, False, ()), "deg2rad": (-200, 200, False, ()),
  "rad2deg": (-3, 3, False, ()), "logit": (0.05, 0.95, False, ()), "sgn": (-2, 2, False, ("int32",)),
  "positive": (-2, 2, False, ()), "signbit": (-2, 2, False, ("int32",)), "nan_to_num": (-2, 2, False, ()),
  "fix": (-3, 3, False, ()), "arcsin": (-0.95, 0.95, False, ()), "arccos": (-0.95, 0.95, False, ()),
  "arctan": (-4, 4, False, ()), "arcsinh": (-4, 4, False, ()), "arccosh": (1.05, 4, False, ()),
  "arctanh": (-0.95, 0.95, False, ()), "absolute": (-2, 2, False, ()), "negative": (-2, 2, False, ()),
}
for _n, (_lo, _hi, _fast, _extra) in UNARY.items():
  add(_n, (lambda n: lambda L, x: getattr(L, n)(x))(_n), U, F32, low=_lo, high=_hi, fast=_fast)
  add(_n + "_method", (lambda n: lambda L, x: getattr(x, n)())(_n), U[:1], F32, low=_lo, high=_hi)
  add(_n + "_dtypes", (lambda n: lambda L, x: getattr(L, n)(x))(_n), U[:2], ("float64", "float16", "bfloat16") + _extra,
      low=_lo, high=_hi, rtol=2e-2 if _n in ("tan",) else None, atol=None)
# the unary ops on integer and bool inputs: float results (PyTorch's int-to-float promotion) or refusals
for _n in ("exp", "log", "sqrt", "sin", "asin", "atan", "sinh", "cosh", "atanh", "sigmoid", "erf", "tanh"):
  add(_n + "_int", (lambda n: lambda L, x: getattr(L, n)(x))(_n), U[:2], ("int32", "int64", "uint8", "bool"),
      low=0, high=1 if _n in ("asin", "atanh") else 4, fast=_n in ("exp", "asin"))
for _n in ("isnan", "isinf", "isfinite", "logical_not", "isneginf", "isposinf", "isreal"):
  add(_n, (lambda n: lambda L, x: getattr(L, n)(x))(_n), U, ("float32", "int32", "bool"), fast=_n == "isnan",
      gen=lambda rng, s, d: np.where(rng.random(s) < 0.3, np.array([np.nan, np.inf, -np.inf])[rng.integers(0, 3, s)],
                                     rng.uniform(-2, 2, s)) if d.startswith("float") else rng.integers(0, 2, s))
add("bitwise_not", lambda L, x: L.bitwise_not(x), U, INTS + ("bool",), fast=True)
add("bitwise_not_float", lambda L, x: L.bitwise_not(x), U[:1], F32)
add("nan_to_num_specials", lambda L, x: L.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-9.0), U, F32_64,
    gen=lambda rng, s, d: np.where(rng.random(s) < 0.4, np.array([np.nan, np.inf, -np.inf])[rng.integers(0, 3, s)],
                                   rng.uniform(-2, 2, s)), grad=False)
# specials through the inverse trig/hyperbolic functions (out of domain gives NaN, the edges +-inf/+-pi/2)
for _n in ("asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
  add(_n + "_specials", (lambda n: lambda L, x: getattr(L, n)(x))(_n), (((40,),),), F32_64, grad=False,
      fast=_n in ("asin", "acosh"),
      gen=lambda rng, s, d: np.concatenate([[np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1.5, -1.5, 1e-6, -1e-6, 50.0,
                                             -50.0, 100.0, 1e10, -1e10], rng.uniform(-3, 3, s[0] - 16)]))

# ---- elementwise binary -------------------------------------------------------------------------------------

BINARY = {   # name: (low, high, fast, dtypes)
  "add": (-2, 2, True, FLOATS + INTS + ("bool",)), "sub": (-2, 2, False, FLOATS + INTS),
  "mul": (-2, 2, True, FLOATS + INTS + ("bool",)), "div": (0.5, 3, True, FLOATS + ("int32",)),
  "true_divide": (0.5, 3, False, F32), "floor_divide": (0.5, 5, False, F32 + ("int32", "int64")),   # PyTorch has no gradient for it
  "remainder": (0.5, 5, False, F32 + ("int32",)), "fmod": (0.5, 5, False, F32 + ("int32",)),
  "maximum": (-2, 2, True, F32 + ("int32", "bool")), "minimum": (-2, 2, False, F32 + ("int32",)),
  "fmax": (-2, 2, False, F32), "fmin": (-2, 2, False, F32),
  "atan2": (-2, 2, True, FLOATS + ("int32",)), "arctan2": (-2, 2, False, F32),
  "copysign": (-2, 2, True, F32_64 + ("int32",)), "logaddexp": (-4, 4, True, FLOATS),
  "logaddexp2": (-4, 4, True, F32_64), "hypot": (-2, 2, False, F32_64), "xlogy": (0.1, 3, False, F32_64),
  "eq": (-2, 2, True, F32 + ("int32", "bool")), "ne": (-2, 2, False, F32 + ("int32",)), "lt": (-2, 2, False, F32 + ("int32",)),
  "le": (-2, 2, False, F32), "gt": (-2, 2, False, F32 + ("uint8",)), "ge": (-2, 2, False, F32),
  "greater": (-2, 2, False, F32), "less_equal": (-2, 2, False, F32), "not_equal": (-2, 2, False, F32),
  "logical_and": (-1, 1, False, F32 + ("int32", "bool")), "logical_or": (-1, 1, False, ("bool",)),
  "logical_xor": (-1, 1, False, ("bool", "int8")), "bitwise_and": (-5, 5, False, INTS + ("bool",)),
  "bitwise_or": (-5, 5, False, ("int32", "bool")), "bitwise_xor": (-5, 5, False, ("int64", "uint8")),
  "pow": (0.2, 2, True, F32_64 + ("int32",)), "float_power": (0.2, 2, False, F32 + ("int32",)),
  "multiply": (-2, 2, False, F32), "subtract": (-2, 2, False, F32), "divide": (0.5, 3, False, F32),
}
for _n, (_lo, _hi, _fast, _dts) in BINARY.items():
  add(_n, (lambda n: lambda L, a, b: getattr(L, n)(a, b))(_n), B, _dts[:1], low=_lo, high=_hi, fast=_fast)
  if len(_dts) > 1: add(_n + "_dtypes", (lambda n: lambda L, a, b: getattr(L, n)(a, b))(_n), B[:2], _dts[1:], low=_lo, high=_hi)
  add(_n + "_method", (lambda n: lambda L, a, b: getattr(a, n)(b))(_n), B[:1], F32, low=_lo, high=_hi)
  # (maximum/minimum/fmax/fmin take a Python number here, where PyTorch raises TypeError: a superset)
  if _n not in ("copysign", "logical_and", "logical_or", "logical_xor", "float_power", "xlogy", "maximum", "minimum",
                "fmax", "fmin", "atan2", "arctan2", "hypot", "logaddexp", "logaddexp2"):
    add(_n + "_scalar", (lambda n: lambda L, a: getattr(L, n)(a, 1.5))(_n), U[:2], F32 + ("int32",), low=_lo, high=_hi)
add("copysign_zeros", lambda L, a, b: L.copysign(a, b), (((24,), (24,)),), F32_64, grad=False,
    gen=lambda rng, s, d: rng.choice([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf], size=s))
add("copysign_scalar", lambda L, a: L.copysign(a, -1.0), U[:2], F32_64)
add("atan2_specials", lambda L, a, b: L.atan2(a, b), (((49,), (49,)),), F32_64, grad=False, fast=True,
    gen=lambda rng, s, d: rng.choice([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], size=s))
add("logaddexp_specials", lambda L, a, b: L.logaddexp(a, b), (((36,), (36,)),), F32_64, grad=False,
    gen=lambda rng, s, d: rng.choice([0.0, 1.0, -100.0, 100.0, np.inf, -np.inf], size=s))
add("logaddexp_large", lambda L, a, b: (L.logaddexp(a, b), L.logaddexp2(a, b)), (((3, 4), (3, 4)),), F32_64,
    low=-200, high=200)
add("xlogy_zeros", lambda L, a, b: L.xlogy(a, b), (((3, 4), (3, 4)),), F32_64, gen=_pos_zeros)
_nonzero = lambda rng, s, d: np.where(rng.random(s) < 0.5, -1, 1) * (rng.uniform(0.5, 5, s) if d.startswith(("float", "bfloat"))
                                                                     else rng.integers(1, 6, s))
add("div_trunc", lambda L, a, b: L.div(a, b, rounding_mode="trunc"), B[:2], F32 + ("int32",), gen=_nonzero)
add("div_floor", lambda L, a, b: L.div(a, b, rounding_mode="floor"), B[:2], F32 + ("int64",), gen=_nonzero)
add("int_div_promotes", lambda L, a, b: (a / b, a // 2, a % 3, -a, a * 2.5), B[:2], ("int32", "int64", "uint8"), low=1, high=9)
add("bool_arith", lambda L, a, b: (a + b, a * b, a & b, a | b, a ^ b, ~a, a.sum(), a.int() + b), B[:2], ("bool",), fast=True)
add("bool_sub_raises", lambda L, a, b: a - b, B[:1], ("bool",))
add("mixed_dtypes", lambda L, a, b: (a.int() + b, a.double() * b, a.long() < b, a.half() + b.int(), a.bool() | (b > 0)),
    B[:2], F32, fast=True)
add("int_float_scalar", lambda L, a: (a + 1.5, a * 2, a / 2, a ** 2, 2 ** a.abs(), a > 0.5), U[:2], INTS, low=-3, high=3)

# ---- pow, including its gradient at 0 -----------------------------------------------------------------------
for _e in (2, 3, 0.5, 1.5, -1, -0.5, 0, 1, 2.5, -2):
  add(f"pow_{_e}", (lambda e: lambda L, x: L.pow(x, e))(_e), U[:1], F32_64, gen=_pos_zeros if _e != int(_e) else _zeros_in,
      fast=_e in (0.5, -1, 1.5))
  # 0-d without zeros: the gradient at a realized 0-d zero has the wrong sign (a graph bug, reported)
  add(f"pow_{_e}_0d", (lambda e: lambda L, x: L.pow(x, e))(_e), U[1:2], F32_64, low=0.2)
add("pow_tensor_zeros", lambda L, a, b: a ** b, B[:2], F32_64, gen=_zeros_in, fast=True)
add("pow_tensor_pos_zeros", lambda L, a, b: a ** b, B[:2], F32_64, gen=_pos_zeros)
add("rpow", lambda L, a: 2.5 ** a, U[:2], F32_64)
add("rpow_zero", lambda L, a: 0.0 ** a, U[:1], F32_64, gen=_zeros_in)
add("pow_int_tensor", lambda L, a, b: a ** b, B[:2], ("int32", "int64"), low=0, high=5)
add("pow_int_negative_scalar", lambda L, a: a ** -1, U[:1], ("int32",), low=1, high=5)
add("square_zero", lambda L, x: (x * x, x.square(), x.pow(2)), U[:2], F32, gen=_zeros_in)
add("sqrt_zero", lambda L, x: x.sqrt(), U[:1], F32_64, gen=_pos_zeros)

# ---- where, clamp, lerp -------------------------------------------------------------------------------------
add("where", lambda L, c, a, b: L.where(c > 0, a, b), T3, F32 + ("int32",), fast=True)
add("where_tensor_scalars", lambda L, c, a: (L.where(c > 0, a, 0.0), L.where(c > 0, 1.5, a), L.where(c > 0, 1.0, 0.0),
                                      L.where(c > 0, 2, -1)), B[:3], F32 + ("int32",), fast=True)
add("where_method", lambda L, c, a: a.where(c > 0, -a), B[:2], F32)
add("where_bool_cond_int", lambda L, c, a: L.where(c > 0, a, 7), B[:2], ("int8", "uint8"))
add("clamp", lambda L, x: (L.clamp(x, -0.5, 0.5), L.clamp(x, min=0.1), L.clamp(x, max=-0.3), x.clip(-1, 1)), U, F32 + ("int32",),
    fast=True)
add("clamp_tensor", lambda L, x, lo, hi: L.clamp(x, lo, lo + hi.abs()), T3[:2], F32, fast=True)
add("clamp_min_gt_max", lambda L, x: L.clamp(x, 1.0, -1.0), U[:1], F32)
add("clamp_int_float_bound", lambda L, x: L.clamp(x, 0.5, 2.5), U[:1], ("int32",))
add("lerp", lambda L, a, b: (L.lerp(a, b, 0.3), a.lerp(b, 1.5)), B[:4], F32 + ("float64", "float16"), fast=True)
add("lerp_tensor_weight", lambda L, a, b, w: L.lerp(a, b, w), T3[:2], F32_64, low=0, high=1)
add("addcmul_addcdiv", lambda L, a, b, c: (L.addcmul(a, b, c, value=0.5), L.addcdiv(a, b, c.abs() + 0.5, value=-2)), T3[:2], F32)

# ---- comparison and closeness --------------------------------------------------------------------------------
_close_gen = lambda rng, s, d: np.where(rng.random(s) < 0.15, np.nan, np.round(rng.uniform(-2, 2, s), 1))
add("isclose", lambda L, a, b: (L.isclose(a, b), L.isclose(a, a + 1e-6), L.isclose(a, b, rtol=0.5, atol=0.2),
                                L.isclose(a, b, equal_nan=True)), B[:3], F32_64, gen=_close_gen, fast=True)
add("isclose_int", lambda L, a, b: (L.isclose(a, b), L.isclose(a, b, atol=1)), B[:2], ("int32", "int64"), low=-2, high=2)
add("isclose_method", lambda L, a, b: a.isclose(b, atol=0.3), B[:1], F32, gen=_close_gen)
add("allclose", lambda L, a, b: (L.allclose(a, b), L.allclose(a, a), L.allclose(a, b, atol=10.0), a.allclose(a + 1e-7),
                                 L.allclose(a, b, equal_nan=True)), B[:3], F32_64, fast=True)
add("allclose_nan", lambda L, a: (L.allclose(a, a), L.allclose(a, a, equal_nan=True)), U[:2], F32, gen=_close_gen)
add("equal", lambda L, a, b: (L.equal(a, b), L.equal(a, a), a.equal(a.clone())), B[:1], F32 + ("int32",))
add("compare_ops_scalars", lambda L, a: (a > 0, a >= 0.5, a < 1, a <= -1, a == 0, a != 0, 0 < a, 1 >= a), U, F32 + ("int32", "uint8"))

# ---- reductions ------------------------------------------------------------------------------------------------
RED = {   # name: (dtypes, fast, takes a dim list)
  "sum": (FLOATS + INTS + ("bool",), True, True), "mean": (FLOATS + ("int32",), True, True),
  "prod": (F32_64 + ("int32", "bool"), False, False), "amax": (F32 + ("int32", "bool"), True, True),
  "amin": (F32 + ("int16",), False, True), "logsumexp": (F32_64 + ("int32",), True, True),
  "var": (F32_64, False, True), "std": (F32_64, False, True), "nansum": (F32, False, True),
  "all": (F32 + ("int32", "bool", "uint8"), False, False), "any": (F32 + ("int32", "bool", "uint8"), False, False),
  "count_nonzero": (F32 + ("int32",), False, True),
}
for _n, (_dts, _fast, _multi) in RED.items():
  f = (lambda n: lambda L, x: (getattr(L, n)(x, 1), getattr(x, n)(dim=-1, keepdim=True) if n != "count_nonzero"
                               else getattr(x, n)(dim=-1)))(_n)
  add(f"{_n}_dim", f, R, _dts[:1], fast=_fast)
  if len(_dts) > 1: add(f"{_n}_dim_dtypes", f, R[:1], _dts[1:])
  add(f"{_n}_axis", (lambda n: lambda L, x: getattr(L, n)(x, axis=1))(_n), R[:1], F32, fast=_fast)
  add(f"{_n}_axis_method", (lambda n: lambda L, x: getattr(x, n)(axis=0))(_n), R[:1], F32)
  if _n not in ("logsumexp", "all", "any", "prod", "count_nonzero"):
    add(f"{_n}_all", (lambda n: lambda L, x: getattr(L, n)(x))(_n), R0, _dts[:1], fast=_fast)
  if _multi:
    add(f"{_n}_dims", (lambda n: lambda L, x: (getattr(L, n)(x, (0, 2)), getattr(L, n)(x, (-1, 0), True)))(_n), R[:1], _dts[:1])
  add(f"{_n}_0d", (lambda n: lambda L, x: getattr(L, n)(x, 0))(_n), (((),),), _dts[:1])
  add(f"{_n}_empty", (lambda n: lambda L, x: (getattr(L, n)(x, 0), getattr(L, n)(x, 1)))(_n), (((0, 4),),), _dts[:1])
  add(f"{_n}_bad_dim", (lambda n: lambda L, x: getattr(L, n)(x, 3))(_n), R[1:], F32)
add("all_any_all", lambda L, x: (L.all(x), L.any(x), x.all(), (x > 1).any()), R0, F32 + ("bool", "int32"))
add("prod_all", lambda L, x: (L.prod(x), x.prod()), R0[:2] + (((0, 4),),), F32_64)
add("prod_zeros", lambda L, x: (x.prod(1), x.prod()), (((3, 4),),), F32_64, gen=_zeros_in, fast=True)
add("sum_dtype", lambda L, x: (x.sum(dtype=L.float64), x.sum(1, dtype=L.int32), L.sum(x, 0, dtype=L.float32)),
    R[1:], ("float32", "int8", "bool"))
add("mean_dtype", lambda L, x: (x.mean(dtype=L.float64), x.mean(1, dtype=L.float32)), R[1:], ("float32", "int32"))
add("var_std_correction", lambda L, x: (x.var(1, correction=0), x.std(0, unbiased=False), x.var(), L.std(x, (0, 1), True),
                                        L.var_mean(x, 1), L.std_mean(x, 0, correction=2)), R[1:], F32_64, fast=True)
add("var_single", lambda L, x: (x.var(0), x.std()), (((1, 3),),), F32)
for _n in ("max", "min"):
  add(f"{_n}_dim", (lambda n: lambda L, x: (getattr(L, n)(x, 1), getattr(x, n)(-1, keepdim=True), getattr(L, n)(x, dim=0)))(_n),
      R, F32, fast=True)
  add(f"{_n}_dim_dtypes", (lambda n: lambda L, x: getattr(L, n)(x, 1))(_n), R[:1], F32_64[1:] + ("int32", "bool"), grad=False)
  add(f"{_n}_axis", (lambda n: lambda L, x: getattr(L, n)(x, axis=1))(_n), R[:1], F32)
  add(f"{_n}_all", (lambda n: lambda L, x: (getattr(L, n)(x), getattr(x, n)()))(_n), R0, F32 + ("int32",))
  add(f"{_n}_binary", (lambda n: lambda L, a, b: getattr(L, n)(a, b))(_n), B[:2], F32)
  add(f"{_n}_0d", (lambda n: lambda L, x: getattr(L, n)(x, 0))(_n), (((),),), F32)
  add(f"{_n}_empty_dim", (lambda n: lambda L, x: getattr(L, n)(x, 1))(_n), (((0, 4),),), F32)
for _n in ("argmax", "argmin"):
  add(f"{_n}", (lambda n: lambda L, x: (getattr(L, n)(x), getattr(L, n)(x, 1), getattr(x, n)(0, keepdim=True),
                                        getattr(x, n)(dim=-1)))(_n), R, F32 + ("int32", "uint8"), fast=_n == "argmax")
  add(f"{_n}_axis", (lambda n: lambda L, x: getattr(L, n)(x, axis=1))(_n), R[:1], F32)
  add(f"{_n}_0d_empty", (lambda n: lambda L, x: getattr(L, n)(x, 0))(_n), (((),), ((0, 3),)), F32)
add("argmax_ties", lambda L, x: (x.argmax(1), x.argmin(0), x.max(1).indices, x.min(0).indices), R[1:], F32, gen=_ties)
add("max_ties_grad", lambda L, x: (x.max(1).values, x.amax(1), x.max(), x.amin(0)), R[1:], F32, gen=_ties)
add("norm", lambda L, x: (L.norm(x), x.norm(), x.norm(p=1), L.norm(x, 2, 1), x.norm(3, 0, True), x.norm(float("inf"), 1),
                          x.norm(dim=(0, 1)), x.norm(p="fro"), x.norm(0, 1)), R[1:] + (((),),), F32_64, fast=True)
add("norm_zero_grad", lambda L, x: (x.norm(), x.norm(dim=1)), (((2, 3),),), F32, gen=lambda rng, s, d: np.zeros(s))
add("norm_int_raises", lambda L, x: L.norm(x), R[1:], ("int32",))

# ---- cumulative -----------------------------------------------------------------------------------------------
CUM = {"cumsum": FLOATS + ("int32", "bool", "uint8"), "cumprod": F32_64 + ("int32", "bool"),
       "logcumsumexp": F32_64, "cummax": F32_64 + ("int32", "bool"), "cummin": F32 + ("int64",)}
for _n, _dts in CUM.items():
  f = (lambda n: lambda L, x: (getattr(L, n)(x, 0), getattr(x, n)(-1), getattr(L, n)(x, dim=0)))(_n)
  add(f"{_n}", f, C, _dts[:1], fast=True, low=-1.5, high=1.5)
  add(f"{_n}_dtypes", f, C[:2], _dts[1:], low=-1.5, high=1.5)
  add(f"{_n}_axis", (lambda n: lambda L, x: getattr(L, n)(x, axis=1))(_n), C[:1], F32)
  add(f"{_n}_bad_dim", (lambda n: lambda L, x: getattr(L, n)(x, 2))(_n), C[:1], F32)
add("cumprod_zeros", lambda L, x: (x.cumprod(1), x.cumprod(0)), (((3, 5),), ((4, 2, 3),)), F32_64, gen=_zeros_in, fast=True)
add("cumprod_shapes", lambda L, x: (x.cumprod(0), x.cumprod(-1)), (((1,),), ((7, 1),), ((1, 6),), ((2, 3, 1, 4),), ((33,),)),
    F32_64, low=0.5, high=1.5)
add("cummax_ties", lambda L, x: (x.cummax(1), x.cummin(0)), (((4, 6),),), F32 + ("int32",), gen=_ties, grad=False)
add("cummax_nan", lambda L, x: (x.cummax(0), x.cummin(0)), (((12,),),), F32,
    gen=lambda rng, s, d: np.where(rng.random(s) < 0.2, np.nan, rng.uniform(-2, 2, s)), grad=False)
# inputs of +-300: a gradient is a sum of window softmax weights of size ~1 that cancels to ~1e-3, ~5e-6 apart
# from torch's scan in float32 (a CI run once drew one past 1e-5)
add("logcumsumexp_large", lambda L, x: x.logcumsumexp(1), (((3, 6),),), F32_64, low=-300, high=300, atol=5e-5)
add("logcumsumexp_inf", lambda L, x: x.logcumsumexp(0), (((10,),),), F32, grad=False,
    gen=lambda rng, s, d: np.where(rng.random(s) < 0.3, -np.inf, rng.uniform(-2, 2, s)))
add("cumsum_dtype", lambda L, x: (x.cumsum(0, dtype=L.float64), L.cumsum(x, 1, dtype=L.int32)), C[:1], ("float32", "int8"))

# ---- sorting and selection -------------------------------------------------------------------------------------
S = (((5, 6),), ((3, 4, 5),), ((7,),), ((),), ((0, 4),))
add("sort", lambda L, x: (L.sort(x), x.sort(0, descending=True), L.sort(x, dim=-1, stable=True)), S, F32 + ("float64",),
    fast=True)
add("sort_ints", lambda L, x: (L.sort(x, stable=True), x.sort(dim=0, descending=True, stable=True)), S[:2], ("int32", "uint8", "bool"))
add("argsort", lambda L, x: (L.argsort(x), x.argsort(0, descending=True), L.argsort(x, stable=True)), S, F32 + ("int64",))
add("sort_nan", lambda L, x: (x.sort(), x.sort(descending=True)), (((12,),),), F32, grad=False,
    gen=lambda rng, s, d: np.where(rng.random(s) < 0.25, np.nan, rng.uniform(-2, 2, s)))
add("topk", lambda L, x: (L.topk(x, 2), x.topk(3, dim=0, largest=False), L.topk(x, 1, -1)), S[:2], F32, fast=True)
add("topk_k0", lambda L, x: x.topk(0), S[:1], F32)
add("topk_bad_k", lambda L, x: x.topk(9), S[:1], F32)
add("kthvalue", lambda L, x: (L.kthvalue(x, 2), x.kthvalue(1, 0, True), L.kthvalue(x, 3, dim=-1)), S[:2], F32)
# integers tie: which of equal elements PyTorch's selection returns is unspecified, so values only
add("kthvalue_ints", lambda L, x: (L.kthvalue(x, 2).values, x.kthvalue(1, 0, True).values), S[:2], ("int32", "int64"))
add("median", lambda L, x: (L.median(x), x.median(1), L.median(x, dim=0, keepdim=True)), S[:2], F32, fast=True)
add("median_ints", lambda L, x: (L.median(x), x.median(1).values, L.median(x, dim=0, keepdim=True).values), S[:2], ("int32",))
add("median_nan", lambda L, x: (x.median(), x.median(0)), (((9,),),), F32, grad=False,
    gen=lambda rng, s, d: np.where(np.arange(s[0]) == rng.integers(0, s[0]), np.nan, rng.uniform(-2, 2, s)))
add("median_1d_0d", lambda L, x: (x.median(), x.median(0)), S[2:4], F32)
add("nanmedian", lambda L, x: (L.nanmedian(x), x.nanmedian(1)), S[:1], F32, grad=False,
    gen=lambda rng, s, d: np.where(rng.random(s) < 0.2, np.nan, rng.uniform(-2, 2, s)))
add("mode", lambda L, x: (L.mode(x), x.mode(0)), S[:2], F32 + ("int32",), gen=_ties, fast=True)
add("unique", lambda L, x: (L.unique(x), L.unique(x, return_counts=True), L.unique(x, return_inverse=True),
                            x.unique(sorted=True, return_inverse=True, return_counts=True)), S[:3] + (((0,),),),
    F32 + ("int32", "bool"), gen=_ties, grad=False, fast=True)
add("unique_dim", lambda L, x: L.unique(x, dim=0), (((6, 3),),), ("int32",), gen=lambda rng, s, d: rng.integers(0, 2, s),
    grad=False)
add("msort", lambda L, x: L.msort(x), S[:2], F32)

# ---- matmul, einsum, linalg ---------------------------------------------------------------------------------------
MM = (((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
      ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((0, 4), (4, 3)), ((3, 0), (0, 2)))
add("matmul", lambda L, a, b: L.matmul(a, b), MM, F32, fast=True)
add("matmul_op", lambda L, a, b: a @ b, MM[3:6], F32_64 + ("int32", "int64"))
add("matmul_half", lambda L, a, b: a @ b, MM[3:4], ("float16", "bfloat16"), rtol=2e-2, atol=2e-2)
add("matmul_bad", lambda L, a, b: a @ b, (((3, 4), (5, 2)), ((), (3,)), ((2, 3, 4), (3, 4, 2))), F32)
add("mm_bmm_mv_dot", lambda L, a, b: (L.mm(a, b), L.bmm(a.unsqueeze(0), b.unsqueeze(0)), L.mv(a, b[:, 0]),
                                      L.dot(a[0], b[:, 0]), L.vdot(a[0], b[:, 1]), L.inner(a, b.T), L.outer(a[0], b[0])),
    (((3, 4), (4, 5)),), F32, fast=True)
add("mm_rejects_1d", lambda L, a, b: L.mm(a, b), (((3, 4), (4,)),), F32)
add("bmm_rejects_2d", lambda L, a, b: L.bmm(a, b), (((3, 4), (4, 5)),), F32)
add("tensordot", lambda L, a, b: (L.tensordot(a, b, dims=1), L.tensordot(a, b.transpose(0, 1), dims=([1], [1]))),
    (((3, 4), (4, 5)),), F32)
add("einsum", lambda L, a, b: (L.einsum("ij,jk->ik", a, b), L.einsum("ij,jk", a, b), L.einsum("ij->ji", a),
                               L.einsum("ij->", a), L.einsum("ij,ij->i", a, a), L.einsum("i,k->ik", a[0], b[0]),
                               L.einsum("ii->i", a[:, :3]), L.einsum("ii", a[:, :3]), L.einsum("ij,kj->ikj", a, b.T)),
    (((3, 4), (4, 5)),), F32, fast=True)
add("einsum_ellipsis_batch", lambda L, a, b: (L.einsum("...ij,...jk->...ik", a, b), L.einsum("bij,bjk->bik", a, b),
                                              L.einsum("b...,b...->b", a, a), L.einsum("...ij->...", a)),
    (((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (1, 4, 5))), F32)
add("einsum_list_and_empty", lambda L, a, b: (L.einsum("ij,jk->ik", [a, b]), L.einsum("i,i->", a[0], a[0])),
    (((0, 4), (4, 2)), ((3, 4), (4, 0))), F32)
add("einsum_scalar", lambda L, a, b: L.einsum(",ij->ij", a, b), (((), (2, 3)),), F32)
add("einsum_bad", lambda L, a, b: L.einsum("ij,jk->ik", a, b), (((3, 4), (5, 6)),), F32)
add("trace_diag", lambda L, x: (L.trace(x), L.diag(x), L.diag(x, 1), L.diag(x, -1), L.diagonal(x), x.diagonal(1),
                                L.diagonal(x, -1, 1, 0), L.diag_embed(x), L.diag(x[0]), L.diag(x[0], -2), x.diag_embed(1, 0, 2)),
    (((3, 4),), ((4, 4),), ((0, 3),)), F32 + ("int32",), fast=True)
add("diagonal_batched", lambda L, x: (x.diagonal(0, 1, 2), L.diagonal(x, 1, -2, -1), L.diagonal(x, -1, 0, 2)),
    (((2, 3, 4),),), F32)
add("tril_triu_functions", lambda L, x: (L.tril(x), L.triu(x, 1), x.tril(-1), x.triu(-2)), (((4, 5),), ((2, 3, 3),)), F32)
add("linalg_vector_norm", lambda L, x: (L.linalg.vector_norm(x), L.linalg.vector_norm(x, 1, -1), L.linalg.vector_norm(x, 3, (0, 1), True),
                                        L.linalg.vector_norm(x, float("inf")), L.linalg.vector_norm(x, float("-inf"), 0),
                                        L.linalg.vector_norm(x, 0), L.linalg.vector_norm(x, 0.5, dtype=L.float64)),
    R + (((),), ((0, 3),)), F32_64, fast=True, low=0.1)
add("linalg_matrix_norm", lambda L, x: (L.linalg.matrix_norm(x), L.linalg.matrix_norm(x, 1), L.linalg.matrix_norm(x, -1),
                                        L.linalg.matrix_norm(x, float("inf")), L.linalg.matrix_norm(x, float("-inf"), keepdim=True),
                                        L.linalg.matrix_norm(x, "fro", (0, 1))), R, F32_64)
add("linalg_norm", lambda L, x: (L.linalg.norm(x), L.linalg.norm(x, 2, 0), L.linalg.norm(x, "fro"), L.linalg.norm(x, 1, (0, 1)),
                                 L.linalg.norm(x, dim=1, keepdim=True)), R[1:] + (((5,),),), F32_64, fast=True)
add("linalg_norm_nuc_raises_or_not", lambda L, x: L.linalg.norm(x, 3), R[1:], F32)
add("linalg_det", lambda L, x: (L.linalg.det(x), L.det(x), x.det()), (((1, 1),), ((3, 3),), ((2, 2, 2),)),
    F32_64, fast=True, rtol=1e-4, atol=1e-5)
add("linalg_det_nonsquare", lambda L, x: L.linalg.det(x), (((2, 3),),), F32)
add("linalg_inv", lambda L, x: (L.linalg.inv(x), L.inverse(x), x.inverse()), (((1, 1),), ((3, 3),), ((2, 2, 2),)),
    F32_64, gen=_wellcond, fast=True, rtol=1e-4, atol=1e-5)
add("linalg_solve", lambda L, a, b: (L.linalg.solve(a, b), L.linalg.solve(a, b[..., 0])), (((3, 3), (3, 2)), ((2, 2, 2), (2, 2, 1))),
    F32_64, gen=lambda rng, s, d: _wellcond(rng, s, d) if s[-1] == s[-2] else rng.uniform(-1, 1, s), rtol=1e-4, atol=1e-5)
add("linalg_cholesky", lambda L, x: (L.linalg.cholesky(x), L.cholesky(x), L.linalg.cholesky(x, upper=True)),
    (((1, 1),), ((3, 3),), ((2, 2, 2),)), F32_64, gen=_spd, fast=True, rtol=1e-4, atol=1e-5)


# (linalg: the graph grows with n, and every kernel of it compiles: shapes up to 3x3 keep each case to seconds)
# the fast subset (`make test` without -m slow deselection runs everything; `-m "not slow"` runs these): one or two
# cases per family, chosen so that it stays well under a minute on two cores with a warm kernel cache
FAST = {"exp", "asin", "atanh", "acosh_specials", "exp_int", "isnan", "bitwise_not", "add", "mul", "div", "atan2",
        "atan2_specials", "copysign", "logaddexp", "bool_arith", "mixed_dtypes", "pow_0.5", "pow_tensor_zeros", "where",
        "where_tensor_scalars", "clamp", "lerp", "isclose", "allclose", "sum_dim", "mean_axis", "logsumexp_dim",
        "var_std_correction", "max_dim", "argmax", "prod_zeros", "norm", "cumsum", "cumprod_zeros", "cummax",
        "logcumsumexp", "sort", "topk", "median", "mode", "unique", "matmul", "mm_bmm_mv_dot", "einsum", "trace_diag",
        "linalg_vector_norm", "linalg_det", "linalg_inv", "linalg_cholesky"}
CASES = [replace(c, fast=c.name in FAST) for c in CASES]
