"""More of torch's API against torch (CPU) on fresh random inputs: metadata (stride, storage_offset, is_contiguous,
data_ptr, nbytes, itemsize, H/mH/adjoint), the in-place view ops (t_, transpose_, swapaxes_, squeeze_, unsqueeze_,
detach_), fill_diagonal_, the random fills and samplers (ranges, statistics, reproducibility under manual_seed and
set_rng_state), as_tensor/asarray/logspace/scalar_tensor/empty_strided/clone, the default dtype, and celu/selu/softmin
with their modules."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import fusegrad as fg
import fusegrad.nn.functional as FF

RNG = np.random.default_rng()


def _pair(a: np.ndarray, grad: bool = False):
  g = grad and a.dtype.kind == "f"
  return fg.tensor(a, requires_grad=g), torch.tensor(a, requires_grad=g)


def _same_error(ffn, tfn):
  with pytest.raises(Exception) as te: tfn()
  with pytest.raises(type(te.value)) as fe: ffn()
  assert str(te.value).split("\n")[0][:60] == str(fe.value).split("\n")[0][:60]


def _dtype_name(t) -> str: return str(t.dtype).replace("torch.", "")


# ---- metadata ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 0, 4), (2, 1, 3, 4)])
def test_metadata(shape):
  a = RNG.standard_normal(shape).astype(np.float32)
  f, t = _pair(a)
  t = torch.empty(shape)    # (torch.tensor of an empty array keeps numpy's strides)
  assert f.stride() == t.stride() and f.storage_offset() == t.storage_offset() == 0 and f.is_contiguous()
  for d in range(-len(shape), len(shape)): assert f.stride(d) == t.stride(d)
  if shape: _same_error(lambda: f.stride(len(shape)), lambda: t.stride(len(shape)))
  for dtype in ("float16", "float64", "int32", "uint8", "bool"):
    fd, td = f.to(getattr(fg, dtype) if dtype != "bool" else fg.bool), t.to(getattr(torch, dtype))
    assert fd.nbytes == td.nbytes and fd.itemsize == td.itemsize == fd.element_size()


def test_data_ptr():
  x = fg.randn(3, 4)
  p = x.data_ptr()
  assert isinstance(p, int) and x.view(12).data_ptr() == p
  x.add_(1)
  assert x.data_ptr() == p and x.clone().data_ptr() != p and fg.randn(2).data_ptr() != p


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (4, 2, 3)])
def test_adjoints(shape):
  a = RNG.standard_normal(shape).astype(np.float32)
  f, t = _pair(a)
  for name in ("H", "mH"):
    try: tv = getattr(t, name)
    except RuntimeError: _same_error(lambda: getattr(f, name), lambda: getattr(t, name)); continue
    np.testing.assert_array_equal(getattr(f, name).numpy(), tv.numpy())
  try: tv = t.adjoint()
  except RuntimeError: _same_error(f.adjoint, t.adjoint); return
  np.testing.assert_array_equal(f.adjoint().numpy(), tv.numpy())
  np.testing.assert_array_equal(fg.adjoint(f).numpy(), tv.numpy())


VIEWS = {   # name: (a view of a 2x3x4 tensor as torch gives it, shapes reshaped to)
  "transpose": (lambda t: t.transpose(0, 2), [(-1,), (4, 6), (2, 2, 3, 2)]),
  "slice": (lambda t: t[:, 1:], [(-1,), (2, 8), (4, 4), (2, 2, 4)]),
  "row": (lambda t: t[1], [(-1,), (4, 3), (2, 2, 3)]),
  "step": (lambda t: t[:, ::2, 1:3], [(-1,), (2, 2, 2, 1), (4, 2)]),
  "permute": (lambda t: t.permute(1, 0, 2), [(-1,), (3, 8), (6, 4), (3, 2, 2, 2)]),
  "expand": (lambda t: t[:, :1].expand(2, 5, 4), [(-1,), (10, 4), (2, 5, 2, 2)]),
  "unsqueezed": (lambda t: t.transpose(1, 2).unsqueeze(1), [(2, 4, 3), (-1,), (8, 3)]),
  "narrow": (lambda t: t.narrow(2, 1, 2), [(6, 2), (-1,), (2, 3, 2, 1)]),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_layouts_reshapes_and_copies_as_torch(name):
  """A view's strides, offset and contiguity are torch's; reshape of a view is a view exactly where torch's is (an
  in-place op on it then reaches the base) and a copy elsewhere (the base untouched); view() raises where torch's
  does; contiguous() of a contiguous view is that view."""
  fn, shapes = VIEWS[name]
  a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
  for shape in shapes:
    f, t = _pair(a)
    fv, tv = fn(f), fn(t)
    assert fv.stride() == tv.stride() and fv.storage_offset() == tv.storage_offset()
    assert fv.is_contiguous() == tv.is_contiguous(), (fv.stride(), tv.stride())
    if name == "expand":
      fr, tr = fv.reshape(shape), tv.reshape(shape)
      np.testing.assert_array_equal(fr.numpy(), tr.numpy())
      assert fr.stride() == tr.stride()
      continue
    fr, tr = fv.reshape(shape), tv.reshape(shape)
    assert fr.stride() == tr.stride() and fr.is_contiguous() == tr.is_contiguous()
    fr.mul_(-3).add_(1); tr.mul_(-3).add_(1)
    close = lambda x, y: np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-6, atol=1e-6)   # (an FMA)
    close(f, t)     # reached the base where torch's did, only there
    close(fv, tv)
    close(fr, tr)
    try: tv.view(shape)
    except RuntimeError: _same_error(lambda: fv.view(shape), lambda: tv.view(shape))
    else: assert fv.view(shape).stride() == tv.view(shape).stride()
    fc, tc = fv.contiguous(), tv.contiguous()
    fc.add_(5); tc.add_(5)
    close(f, t)
  y = fg.tensor(a) * 2                 # a computed tensor: contiguous() is itself, as torch's
  yc = y.contiguous()
  yc.sub_(1)
  np.testing.assert_array_equal(y.numpy(), a * 2 - 1)


def test_reshape_copy_keeps_autograd():
  a = RNG.standard_normal((3, 4)).astype(np.float32)
  w = RNG.standard_normal(12).astype(np.float32)
  f, t = _pair(a, grad=True)
  fr, tr = (f * 2).t().reshape(-1), (t * 2).t().reshape(-1)
  (fr * fg.tensor(w)).sum().backward(); (tr * torch.tensor(w)).sum().backward()
  np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-6)
  _same_error(lambda: (f * 2).t().view(12), lambda: (t * 2).t().view(12))


# ---- in-place view ops ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,shape,args", [("t_", (2, 3), ()), ("t_", (3,), ()), ("transpose_", (2, 3, 4), (0, 2)),
                                           ("swapaxes_", (2, 3, 4), (-1, 1)), ("squeeze_", (2, 1, 3, 1), ()),
                                           ("squeeze_", (2, 1, 3, 1), (1,)), ("squeeze_", (2, 1, 3, 1), ((1, 3),)),
                                           ("squeeze_", (2, 1, 3), (0,)), ("unsqueeze_", (2, 3), (-1,)),
                                           ("unsqueeze_", (2, 3), (1,))])
def test_inplace_views(op, shape, args):
  a = RNG.standard_normal(shape).astype(np.float32)
  f, t = _pair(a)
  fv, tv = f.reshape(-1), t.reshape(-1)            # a view taken before
  assert getattr(f, op)(*args) is f and getattr(t, op)(*args) is t
  assert f.shape == tuple(t.shape) and f.stride() == t.stride() and f.is_contiguous() == t.is_contiguous()
  np.testing.assert_array_equal(f.numpy(), t.numpy())
  idx = (0,) * f.ndim
  f[idx] = 7.0; t[idx] = 7.0                      # a write after: the earlier view sees it
  np.testing.assert_array_equal(fv.numpy(), tv.numpy())
  np.testing.assert_array_equal(f.numpy(), t.numpy())
  fv.mul_(2); tv.mul_(2)                           # and the other way round
  np.testing.assert_array_equal(f.numpy(), t.numpy())


def test_inplace_view_autograd_and_errors():
  a = RNG.standard_normal((2, 3)).astype(np.float32)
  w = RNG.standard_normal((3, 2)).astype(np.float32)
  fa, ta = _pair(a, grad=True)
  fb, tb = fa * 2, ta * 2
  fb.t_(); tb.t_()
  (fb * fg.tensor(w)).sum().backward(); (tb * torch.tensor(w)).sum().backward()
  np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-6)
  _same_error(lambda: fa.t_(), lambda: ta.t_())    # a leaf that requires grad
  _same_error(lambda: fg.zeros(2, 3, 4).t_(), lambda: torch.zeros(2, 3, 4).t_())
  _same_error(lambda: fg.zeros(2, 3).unsqueeze_(5), lambda: torch.zeros(2, 3).unsqueeze_(5))
  _same_error(lambda: fg.zeros(2, 3).transpose_(0, 3), lambda: torch.zeros(2, 3).transpose_(0, 3))


def test_detach_():
  a = RNG.standard_normal((2, 3)).astype(np.float32)
  fa, ta = _pair(a, grad=True)
  fb, tb = fa * 2, ta * 2
  fc, tc = fb * 3, tb * 3
  assert fb.detach_() is fb and tb.detach_() is tb
  assert fb.requires_grad is tb.requires_grad is False and fb.is_leaf and tb.is_leaf
  np.testing.assert_array_equal(fb.numpy(), tb.detach().numpy())
  fc.sum().backward(); tc.sum().backward()        # a recipe recorded before still reaches a
  np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy())
  fd = fb * fa; fd.sum().backward()                # after: no gradient through b
  td = tb * ta; td.sum().backward()
  np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-6)
  f2, t2 = _pair(a, grad=True)
  _same_error(lambda: (f2 * 1)[0].detach_(), lambda: (t2 * 1)[0].detach_())
  assert f2.detach_() is f2 and not f2.requires_grad


# ---- fill_diagonal_ ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 3), (2, 5), (7, 3), (8, 2), (3, 3, 3), (2, 2, 2, 2)])
@pytest.mark.parametrize("wrap", [False, True])
def test_fill_diagonal(shape, wrap):
  a = RNG.standard_normal(shape).astype(np.float32)
  v = float(RNG.standard_normal())
  f, t = _pair(a)
  np.testing.assert_array_equal(f.fill_diagonal_(v, wrap=wrap).numpy(), t.fill_diagonal_(v, wrap=wrap).numpy())
  fi, ti = fg.zeros(*shape, dtype=fg.long), torch.zeros(*shape, dtype=torch.long)
  np.testing.assert_array_equal(fi.fill_diagonal_(2.7, wrap).numpy(), ti.fill_diagonal_(2.7, wrap).numpy())


def test_fill_diagonal_errors_and_grad():
  _same_error(lambda: fg.zeros(3).fill_diagonal_(1), lambda: torch.zeros(3).fill_diagonal_(1))
  _same_error(lambda: fg.zeros(2, 3, 4).fill_diagonal_(1), lambda: torch.zeros(2, 3, 4).fill_diagonal_(1))
  a = RNG.standard_normal((3, 4)).astype(np.float32)
  fa, ta = _pair(a, grad=True)
  fb, tb = fa * 1, ta * 1
  fb.fill_diagonal_(0.5); tb.fill_diagonal_(0.5)
  (fb * fb).sum().backward(); (tb * tb).sum().backward()
  np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-6)


# ---- random fills -----------------------------------------------------------------------------------------------

N = 40000


def _stats(x: np.ndarray, mean: float, std: float, k: float = 6.0) -> None:
  x = x.astype(np.float64)
  assert abs(x.mean() - mean) < k * std / np.sqrt(x.size) + 1e-9, (x.mean(), mean)
  assert abs(x.std() - std) < 0.05 * std + 1e-9, (x.std(), std)


def _repeat(make) -> None:
  """make() twice under one seed, and after set_rng_state: the same values."""
  fg.manual_seed(1234)
  a = make().numpy()
  st = fg.get_rng_state()
  b = make().numpy()
  fg.manual_seed(1234)
  np.testing.assert_array_equal(make().numpy(), a)
  fg.set_rng_state(st)
  np.testing.assert_array_equal(make().numpy(), b)
  assert not np.array_equal(a, b)


def test_bernoulli():
  p = float(RNG.uniform(0.1, 0.9))
  for d in (fg.float32, fg.float64, fg.int64, fg.uint8):
    x = fg.zeros(N, dtype=d).bernoulli_(p)
    assert x.dtype == d and set(np.unique(x.numpy())) <= {0, 1}
    _stats(x.numpy(), p, np.sqrt(p * (1 - p)))
  probs = RNG.uniform(0, 1, 8).astype(np.float32)
  probs[0], probs[1] = 0.0, 1.0
  f = fg.tensor(probs)
  draws = np.stack([fg.bernoulli(f).numpy() for _ in range(400)])
  assert draws[:, 0].sum() == 0 and draws[:, 1].min() == 1
  np.testing.assert_allclose(draws.mean(0), probs, atol=0.1)
  assert f.bernoulli().dtype == fg.float32 and fg.bernoulli(f, 0.5).shape == (8,)
  fp = fg.tensor(probs[:1]).expand(N)
  _stats(fg.zeros(N).bernoulli_(fg.full((N,), p)).numpy(), p, np.sqrt(p * (1 - p)))
  assert fp.shape == (N,)
  _repeat(lambda: fg.zeros(100).bernoulli_(0.5))
  _repeat(lambda: f.bernoulli())
  _same_error(lambda: fg.zeros(3).bernoulli_(1.5), lambda: torch.zeros(3).bernoulli_(1.5))
  _same_error(lambda: fg.bernoulli(fg.zeros(3, dtype=fg.long)), lambda: torch.bernoulli(torch.zeros(3, dtype=torch.long)))


def test_continuous_fills():
  lam = float(RNG.uniform(0.5, 3))
  x = fg.empty(N).exponential_(lam).numpy()
  assert x.min() >= 0 and np.isfinite(x).all()
  _stats(x, 1 / lam, 1 / lam)
  m, s = float(RNG.uniform(-1, 1)), float(RNG.uniform(0.2, 0.6))
  x = fg.empty(N, dtype=fg.float64).log_normal_(m, s).numpy()
  assert x.min() > 0
  _stats(np.log(x), m, s)
  med, sig = float(RNG.uniform(-2, 2)), float(RNG.uniform(0.5, 2))
  x = fg.empty(N).cauchy_(med, sig).numpy()
  assert abs(np.median(x) - med) < 0.05 * sig and abs(np.percentile(x, 75) - med - sig) < 0.08 * sig
  for d in (fg.float32, fg.int64):
    p = float(RNG.uniform(0.2, 0.7))
    x = fg.zeros(N, dtype=d).geometric_(p).numpy()
    assert x.min() >= 1 and (x == np.round(x)).all()
    _stats(x, 1 / p, np.sqrt(1 - p) / p)
  for name, args in (("exponential_", ()), ("log_normal_", ()), ("cauchy_", ()), ("geometric_", (0.3,))):
    _repeat(lambda: getattr(fg.empty(64), name)(*args))
  z = fg.zeros(3, dtype=fg.float16).exponential_()
  assert z.dtype == fg.float16
  for fn in (lambda L: L.zeros(3).exponential_(-1), lambda L: L.zeros(3, dtype=L.long).exponential_(),
             lambda L: L.zeros(3).geometric_(0), lambda L: L.zeros(3).geometric_(1.5),
             lambda L: L.zeros(3).log_normal_(0, -1), lambda L: L.zeros(3, dtype=L.long).log_normal_(),
             lambda L: L.zeros(3, dtype=L.long).cauchy_(), lambda L: L.zeros(3).cauchy_(0, -1.5)):
    _same_error(lambda: fn(fg), lambda: fn(torch))
  _same_error(lambda: fg.zeros(3, requires_grad=True).exponential_(),
              lambda: torch.zeros(3, requires_grad=True).exponential_())


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool"])
def test_random_(dtype):
  fd, td = getattr(fg, dtype) if dtype != "bool" else fg.bool, getattr(torch, dtype)
  x = fg.zeros(N, dtype=fd).random_().numpy().astype(np.float64)
  hi = 1 if dtype == "bool" else {"float32": 2 ** 24, "float64": 2 ** 53, "float16": 2 ** 11}.get(
    dtype, np.iinfo(np.dtype(dtype)).max if dtype in ("int64", "int32", "int8", "uint8") else 0)
  assert x.min() >= 0 and x.max() <= hi and x.max() > hi * 0.9
  assert (x == np.round(x)).all()
  if dtype != "bool":
    lo, top = (-5, 7) if dtype != "uint8" else (3, 200)
    for args in ((lo, top), (top,)):
      f = fg.zeros(N, dtype=fd).random_(*args)
      assert f.dtype == fd
      v = f.numpy()
      a0, a1 = (args[0], args[1]) if len(args) == 2 else (0, args[0])
      assert v.min() == a0 and v.max() == a1 - 1
      assert set(np.unique(v)) == set(range(a0, a1))
    assert fg.zeros(N, dtype=fd).random_(to=3).numpy().max() == 2
  _repeat(lambda: fg.zeros(50, dtype=fd).random_())
  for fn in (lambda L, d: L.zeros(3, dtype=d).random_(5, 2), lambda L, d: L.zeros(3, dtype=d).random_(0, 300),
             lambda L, d: L.zeros(3, dtype=d).random_(-300, 3)):
    try: fn(torch, td)
    except RuntimeError: _same_error(lambda: fn(fg, fd), lambda: fn(torch, td))
    else: fn(fg, fd)


# ---- samplers and the generator's state -------------------------------------------------------------------------

def test_normal():
  m = RNG.standard_normal((3, 1)).astype(np.float32)
  s = RNG.uniform(0.5, 2, (4,)).astype(np.float32)
  fm, tm = _pair(m)
  fs, ts = _pair(s)
  for fo, to in ((fg.normal(fm, fs), torch.normal(tm, ts)), (fg.normal(fm, 2.0), torch.normal(tm, 2.0)),
                 (fg.normal(0.5, fs), torch.normal(0.5, ts)), (fg.normal(1.0, 2.0, (5, 2)), torch.normal(1.0, 2.0, (5, 2))),
                 (fg.normal(fm.double(), fs), torch.normal(tm.double(), ts))):
    assert fo.shape == tuple(to.shape) and fo.dtype.name == _dtype_name(to)
  mu, sd = float(RNG.standard_normal()), float(RNG.uniform(0.5, 2))
  _stats(fg.normal(mu, sd, size=(N,)).numpy(), mu, sd)
  _stats(fg.normal(fg.full((N,), mu), sd).numpy(), mu, sd)
  _stats(fg.normal(mu, fg.full((N,), sd)).numpy(), mu, sd)
  _repeat(lambda: fg.normal(fm, fs))
  _same_error(lambda: fg.normal(fm, -1.0), lambda: torch.normal(tm, -1.0))
  _same_error(lambda: fg.normal(fg.zeros(3, dtype=fg.long), 1.0), lambda: torch.normal(torch.zeros(3, dtype=torch.long), 1.0))
  _same_error(lambda: fg.normal(0.0, 1.0), lambda: torch.normal(0.0, 1.0))


@pytest.mark.parametrize("rate", [0.0, 0.3, 4.0, 9.5, 12.0, 150.0, 2e5])
def test_poisson(rate):
  r = rate * float(RNG.uniform(0.9, 1.1))
  x = fg.poisson(fg.full((N,), r)).numpy()
  assert x.dtype == np.float32 and (x >= 0).all() and (x == np.round(x)).all()
  if r == 0: assert (x == 0).all(); return
  _stats(x, r, np.sqrt(r))


def test_poisson_misc():
  rates = RNG.uniform(0, 30, (4, 5))
  f = fg.tensor(rates)
  assert fg.poisson(f).dtype == fg.float64 and fg.poisson(f).shape == (4, 5)
  _repeat(lambda: fg.poisson(f))
  assert np.isnan(fg.poisson(fg.tensor([-1.0])).numpy()).all()   # (torch raises: it reads the rates)
  _same_error(lambda: fg.poisson(fg.tensor([1, 2])), lambda: torch.poisson(torch.tensor([1, 2])))


def test_rng_state():
  s = int(RNG.integers(0, 2 ** 40))
  fg.manual_seed(s)
  assert fg.initial_seed() == s
  fg.rand(3)
  st = fg.get_rng_state()
  assert st.dtype == fg.uint8 and st.shape == (16,)
  a = (fg.rand(5), fg.randn(5), fg.randint(0, 100, (5,)), fg.randperm(7))
  fg.set_rng_state(st)
  b = (fg.rand(5), fg.randn(5), fg.randint(0, 100, (5,)), fg.randperm(7))
  for x, y in zip(a, b): np.testing.assert_array_equal(x.numpy(), y.numpy())
  assert fg.initial_seed() == s
  with pytest.raises(RuntimeError): fg.set_rng_state(fg.zeros(16))
  with pytest.raises(TypeError): fg.set_rng_state([0] * 16)


# ---- constructors -------------------------------------------------------------------------------------------------

def test_as_tensor_asarray():
  a = RNG.standard_normal((2, 3)).astype(np.float32)
  f = fg.tensor(a)
  assert fg.as_tensor(f) is f and fg.as_tensor(f, dtype=fg.float32) is f and fg.as_tensor(f, device="cpu") is f
  g = fg.as_tensor(f, dtype=fg.float64)
  assert g.dtype == fg.float64 and np.allclose(g.numpy(), a)
  n = fg.as_tensor(a)                            # shares the array, as torch.as_tensor
  a[0, 0] = 42.0
  assert n.numpy()[0, 0] == 42.0 == torch.as_tensor(a)[0, 0].item()
  for data, dtype in (([1.5, 2.5], None), ([1, 2], None), ([1, 2], "float64"), ((True, False), None),
                      (3.5, None), (np.arange(4, dtype=np.int16), None), (np.arange(4), "float32")):
    fd = getattr(fg, dtype) if dtype else None
    td = getattr(torch, dtype) if dtype else None
    for ffn, tfn in ((fg.as_tensor, torch.as_tensor), (fg.asarray, torch.asarray)):
      fo, to = ffn(data, dtype=fd), tfn(data, dtype=td)
      assert fo.dtype.name == _dtype_name(to) and fo.shape == tuple(to.shape)
      np.testing.assert_array_equal(fo.numpy(), to.numpy())
  c = fg.asarray(f, copy=True)
  c.add_(1)
  assert not np.allclose(c.numpy(), f.numpy())
  assert fg.asarray([1.0, 2.0], requires_grad=True).requires_grad


@pytest.mark.parametrize("args,kw", [((0, 2, 3), {}), ((-1, 1.5, 7), {}), ((0, 2, 3), {"base": 2}),
                                     ((0, 3, 4), {"base": 2, "dtype": "int64"}), ((0, 1, 3), {"dtype": "int64"}),
                                     ((1, -2, 5), {"base": 3.0, "dtype": "float64"}), ((0, 1, 1), {}), ((0, 1, 0), {}),
                                     ((2, 0, 4), {"base": 0.5, "dtype": "float16"})])
def test_logspace(args, kw):
  fkw = {**kw, **({"dtype": getattr(fg, kw["dtype"])} if "dtype" in kw else {})}
  tkw = {**kw, **({"dtype": getattr(torch, kw["dtype"])} if "dtype" in kw else {})}
  fo, to = fg.logspace(*args, **fkw), torch.logspace(*args, **tkw)
  assert fo.dtype.name == _dtype_name(to) and fo.shape == tuple(to.shape)
  np.testing.assert_allclose(fo.numpy().astype(np.float64), to.numpy().astype(np.float64), rtol=1e-3 if "float16" in str(kw) else 1e-6)
  _same_error(lambda: fg.logspace(0, 1, -1), lambda: torch.logspace(0, 1, -1))


def test_default_dtype():
  assert fg.get_default_dtype() == fg.float32
  try:
    fg.set_default_dtype(fg.float64)
    assert fg.get_default_dtype() == fg.float64
    assert fg.zeros(2).dtype == fg.rand(2).dtype == fg.arange(0.0, 1.0, 0.5).dtype == fg.float64
    assert fg.scalar_tensor(3).dtype == fg.as_tensor([1.5]).dtype == fg.float64
    assert (fg.arange(3) * 1.5).dtype == fg.float64
    v = RNG.standard_normal(3).tolist()     # Python floats: the default dtype, converted from the doubles as torch's
    np.testing.assert_array_equal(fg.tensor(v).numpy(), np.array(v)) and fg.tensor(0.1).item() == 0.1
    assert fg.tensor(1.5).dtype == fg.tensor([[1, 2.5]]).dtype == fg.float64 and fg.tensor([1, 2]).dtype == fg.int64
    assert fg.tensor(np.float32(1)).dtype == fg.tensor(np.ones(2, np.float32)).dtype == fg.float32
    fg.set_default_dtype(fg.float16)
    assert fg.tensor(v).dtype == fg.float16 and fg.tensor(v).float().numpy().tolist() == \
      torch.tensor(v, dtype=torch.float16).float().tolist()
    fg.set_default_dtype(fg.bfloat16)
    assert fg.tensor(v).float().numpy().tolist() == torch.tensor(v, dtype=torch.bfloat16).float().tolist()
  finally:
    fg.set_default_dtype(fg.float32)
  assert fg.zeros(2).dtype == fg.float32
  _same_error(lambda: fg.set_default_dtype(fg.int64), lambda: torch.set_default_dtype(torch.int64))


def test_scalar_empty_strided_clone():
  for v, d in ((3, None), (2.5, None), (True, None), (7, "int64"), (1.25, "float64")):
    fo = fg.scalar_tensor(v, dtype=getattr(fg, d) if d else None)
    to = torch.scalar_tensor(v, dtype=getattr(torch, d) if d else None)
    assert fo.shape == () and fo.dtype.name == _dtype_name(to) and fo.item() == to.item()
  e = fg.empty_strided((2, 3), (1, 2))
  assert e.shape == (2, 3) and e.dtype == fg.float32 and e.stride() == (3, 1)
  assert fg.empty_strided((2, 3), (3, 1), dtype=fg.int32).dtype == fg.int32
  _same_error(lambda: fg.empty_strided((2, 3), (1,)), lambda: torch.empty_strided((2, 3), (1,)))
  a = RNG.standard_normal((3, 2)).astype(np.float32)
  fa, ta = _pair(a, grad=True)
  fc, tc = fg.clone(fa), torch.clone(ta)
  fc.mul_(3); tc.mul_(3)
  np.testing.assert_array_equal(fa.numpy(), a)
  (fc * fc).sum().backward(); (tc * tc).sum().backward()
  np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-6)


# ---- activations ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_celu_selu_softmin(dtype):
  a = (RNG.standard_normal((4, 5)) * 3).astype(dtype)
  alpha = float(RNG.uniform(0.3, 2))
  tol = 2e-3 if dtype == "float16" else 1e-5
  for fn in (lambda L, F, x: F.celu(x, alpha), lambda L, F, x: F.celu(x), lambda L, F, x: F.selu(x),
             lambda L, F, x: F.softmin(x, 1), lambda L, F, x: F.softmin(x, 0, dtype=L.float64),
             lambda L, F, x: L.nn.CELU(alpha)(x), lambda L, F, x: L.nn.SELU()(x), lambda L, F, x: L.nn.Softmin(1)(x)):
    f, t = _pair(a, grad=dtype != "float16")
    fo, to = fn(fg, FF, f), fn(torch, TF, t)
    assert fo.dtype.name == _dtype_name(to) and fo.shape == tuple(to.shape)
    np.testing.assert_allclose(fo.numpy().astype(np.float64), to.detach().numpy().astype(np.float64), rtol=tol, atol=tol)
    if dtype != "float16":
      w = RNG.standard_normal(a.shape)
      (fo * fg.tensor(w, dtype=fo.dtype)).sum().backward(); (to * torch.tensor(w, dtype=to.dtype)).sum().backward()
      np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)
  assert repr(fg.nn.CELU(0.5)) == repr(torch.nn.CELU(0.5)) and repr(fg.nn.SELU()) == repr(torch.nn.SELU())
  assert repr(fg.nn.Softmin(1)) == repr(torch.nn.Softmin(1))


def test_activation_errors():
  for fn in (lambda L, F: F.celu(L.zeros(3, dtype=L.long)), lambda L, F: F.selu(L.zeros(3, dtype=L.long)),
             lambda L, F: F.celu(L.zeros(3), alpha=0.0)):
    _same_error(lambda: fn(fg, FF), lambda: fn(torch, TF))
