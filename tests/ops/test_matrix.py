"""The operator matrix: every OpCase of every tests/ops/table_*.py, run with fusegrad and with PyTorch (CPU).

For each case x shape variant x dtype the inputs are drawn afresh (the `rng` fixture prints its seed), the case's
fn runs with L = fusegrad and L = torch, and the results are compared: type, dtype, shape and values (with the
dtype's tolerance), field by field for tuples and PyTorch's return types. Where PyTorch raises, fusegrad must raise
the same exception type. For float32/float64 inputs of a case with grad=True, the gradients of a random-weighted sum
of the float outputs are compared too. float16/bfloat16 references run in float32 on the same (rounded) inputs and
are cast back, as fusegrad computes them (tests/test_ops.py: ref); their gradients are not compared.

Cases with fast=True run in the normal suite (`make test`); the rest are marked slow and ops_full: `make test-ops`
runs them (and CI, after `make test`). The CPU device runs everything; the fast cases' first variant also runs on PYTHON (the interpreter).
"""
from __future__ import annotations
import importlib
import sys
from pathlib import Path
import numpy as np
import pytest
import torch
import fusegrad as fg
from test_ops import TOL, data, to_np, tname

HERE = Path(__file__).parent
if str(HERE) not in sys.path: sys.path.insert(0, str(HERE))
from spec import OpCase  # noqa: E402

HALF = ("float16", "bfloat16")
# gradients are compositions of several ops in both libraries: a little looser than a single op's result
GRAD_TOL = {"float32": (1e-4, 1e-5), "float64": (1e-8, 1e-10)}


def _load_cases() -> list[OpCase]:
  cases, seen = [], set()
  for path in sorted(HERE.glob("table_*.py")):
    mod = importlib.import_module(path.stem)
    for c in mod.CASES:
      if c.name in seen: raise ValueError(f"{path.name}: operator case {c.name!r} is defined twice")
      seen.add(c.name)
      cases.append(c)
  return cases


CASES = _load_cases()


def _params():
  out = []
  for c in CASES:
    marks = () if c.fast else (pytest.mark.slow, pytest.mark.ops_full)
    for i, shapes in enumerate(c.shapes):
      for d in c.dtypes:
        out.append(pytest.param(c, i, d, "CPU", id=f"{c.name}-{i}-{d}", marks=marks))
    if c.fast:
      out.append(pytest.param(c, 0, c.dtypes[0], "PYTHON", id=f"{c.name}-0-{c.dtypes[0]}-PYTHON"))
  return out


# ---- inputs ------------------------------------------------------------------------------------------------

def _draw(rng, case: OpCase, shape, dtype: str) -> np.ndarray:
  if case.gen is None: return data(rng, shape, dtype, case.low, case.high)
  a = np.asarray(case.gen(rng, shape, dtype))
  if a.shape != tuple(shape): raise ValueError(f"{case.name}: gen gave shape {a.shape} for {shape}")
  if dtype in ("bool",) or not a.dtype.kind == "f": return a.astype(dtype)
  return torch.tensor(a).to(getattr(torch, dtype)).double().numpy()   # representable in dtype


def _inputs(arrays, dtype: str, device: str, grad: bool):
  fgs = [fg.tensor(a, dtype=dtype, device=device, requires_grad=grad) for a in arrays]
  ths = [torch.tensor(a).to(getattr(torch, dtype)).requires_grad_(grad) for a in arrays]
  return fgs, ths


def _flat(r) -> list:
  """A result as a list of leaves (tensors, Python numbers), tuples and PyTorch's return types flattened."""
  if isinstance(r, (tuple, list)): return [x for v in r for x in _flat(v)]
  return [r]


def _fields(r) -> tuple:
  return tuple(f for f in ("values", "indices", "Q", "R", "L", "U") if hasattr(r, f) and isinstance(r, tuple))


# ---- comparing ---------------------------------------------------------------------------------------------

def _tol(case: OpCase, d: str, table=TOL) -> tuple:
  r, a = table[d]
  return (case.rtol if case.rtol is not None else r), max(a, case.atol or 0.0)


def _compare(case: OpCase, got, want, label: str) -> None:
  if isinstance(want, torch.Tensor):
    assert isinstance(got, fg.Tensor), f"{label}: expected a fusegrad Tensor, got {type(got).__name__}"
    assert got.dtype.name == tname(want.dtype), f"{label}: dtype {got.dtype.name}, torch gives {tname(want.dtype)}"
    assert got.shape == tuple(want.shape), f"{label}: shape {got.shape}, torch gives {tuple(want.shape)}"
    g, w = to_np(got), to_np(want.detach())
    if want.dtype.is_floating_point:
      r, a = _tol(case, tname(want.dtype))
      np.testing.assert_allclose(g, w, rtol=r, atol=a, equal_nan=True, err_msg=label)
    else:
      np.testing.assert_array_equal(g, w, err_msg=label)
  elif isinstance(want, (bool, int, float)):
    assert type(got) is type(want), f"{label}: {type(got).__name__} {got!r}, torch gives {type(want).__name__} {want!r}"
    if isinstance(want, float): np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True, err_msg=label)
    else: assert got == want, f"{label}: {got!r}, torch gives {want!r}"
  else:
    raise TypeError(f"{label}: the matrix cannot compare a torch result of type {type(want).__name__}")


def _ref(case: OpCase, ths: list, dtype: str):
  """torch's result; 16-bit floats computed in float32 and cast back (dtypes from the native run)."""
  native = case.fn(torch, *ths)
  if dtype not in HALF: return native
  up = case.fn(torch, *[t.detach().float() for t in ths])
  nat, upl = _flat(native), _flat(up)
  cast = [u.to(n.dtype) if isinstance(n, torch.Tensor) and n.dtype.is_floating_point else n for n, u in zip(nat, upl)]
  return cast if isinstance(native, (tuple, list)) else cast[0]


@pytest.mark.parametrize("case,variant,dtype,device", _params())
def test_op(rng, case: OpCase, variant: int, dtype: str, device: str):
  shapes = case.shapes[variant]
  arrays = [_draw(rng, case, s, dtype) for s in shapes]
  grad = case.grad and dtype in GRAD_TOL and len(arrays) > 0
  fgs, ths = _inputs(arrays, dtype, device, grad)
  label = f"{case.name} shapes {shapes} {dtype} on {device}"
  want, err = None, None
  try:
    want = _ref(case, ths, dtype)
  except Exception as e:   # noqa: BLE001
    err = e
  if err is not None and grad:   # some forms (a sum into an integer dtype) refuse inputs that need a gradient
    grad = False
    fgs, ths = _inputs(arrays, dtype, device, False)
    try:
      want, err = _ref(case, ths, dtype), None
    except Exception as e:   # noqa: BLE001
      err = e
  if err is not None:   # PyTorch refuses: fusegrad must refuse with the same exception type
    with pytest.raises(type(err)):
      case.fn(fg, *fgs)
    return
  got = case.fn(fg, *fgs)
  if isinstance(want, tuple) and _fields(want):
    for f in _fields(want):
      assert hasattr(got, f), f"{label}: the result has no field {f!r} (torch's has)"
  gl, wl = _flat(got), _flat(want)
  assert len(gl) == len(wl), f"{label}: {len(gl)} results, torch gives {len(wl)}"
  ts = [g for g in gl if isinstance(g, fg.Tensor)]
  if ts: fg.realize(*ts)
  for k, (g, w) in enumerate(zip(gl, wl)): _compare(case, g, w, f"{label}, result {k}")
  if grad: _check_grads(case, rng, fgs, ths, gl, wl, dtype, label)


def _check_grads(case: OpCase, rng, fgs, ths, gl, wl, dtype, label) -> None:
  outs = [(g, w) for g, w in zip(gl, wl) if isinstance(w, torch.Tensor) and w.requires_grad]
  if not outs: return
  floss, tloss = 0, 0
  for g, w in outs:
    assert isinstance(g, fg.Tensor) and g.requires_grad, f"{label}: a result needs a gradient in torch but not here"
    wt = rng.uniform(-1, 1, size=tuple(w.shape))
    floss = floss + (g * fg.tensor(wt, dtype=g.dtype, device=g.device)).sum()
    tloss = tloss + (w * torch.tensor(wt).to(w.dtype)).sum()
  try:
    tg = torch.autograd.grad(tloss, ths, allow_unused=True)
  except RuntimeError as e:   # PyTorch has no derivative for this op (floor_divide): nothing to compare with
    if "not implemented" in str(e): return
    raise
  fgr = fg.grad(floss, fgs, allow_unused=True)
  r, a = _tol(case, dtype, GRAD_TOL)
  for k, (f, t, x) in enumerate(zip(fgr, tg, ths)):
    want = t.detach() if t is not None and not t._is_zerotensor() else torch.zeros_like(x)
    got = f.numpy() if f is not None else np.zeros(tuple(x.shape))
    assert got.shape == tuple(want.shape), f"{label}: gradient {k} shape {got.shape}, torch gives {tuple(want.shape)}"
    np.testing.assert_allclose(got, want.numpy(), rtol=r, atol=a, equal_nan=True, err_msg=f"{label}, gradient {k}")
