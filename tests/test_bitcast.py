"""Bit casts: Tensor.view(dtype) (ops_math.view_dtype, the BITCAST node) against torch's, bit for bit (NaN payloads,
signalling NaNs, -0.0, infinities, denormals, the integers' extremes), on the interpreter and the C device: every pair
of dtypes, size-changing views both ways, fused into one kernel, as vectors, through views torch allows, and torch's
errors."""
from __future__ import annotations
import re
import numpy as np
import pytest
import torch
import fusegrad as fg
from fusegrad.runtime import device as rd
from fusegrad.schedule.schedule import create_schedule

DEVICES = ["PYTHON", "CPU"]
NAMES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"]
SIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
        "int64": 8, "bool": 1}
BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}   # numpy integers holding each size's bits
# bit patterns worth a test beside random ones: quiet and signalling NaNs with payloads (both signs), infinities,
# -0.0, the smallest and largest denormals, the largest finite values; the integers' extremes
SPECIAL = {
  "float32": [0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FA00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001,
              0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF],
  "float64": [0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000001, 0x7FF4000000000123, 0x7FF0000000000000,
              0xFFF0000000000000, 0x8000000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x7FEFFFFFFFFFFFFF],
  "float16": [0x7E00, 0xFE01, 0x7C01, 0x7D55, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF],
  "bfloat16": [0x7FC0, 0xFFC1, 0x7F81, 0x7FA5, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F, 0x7F7F, 0xFF7F],
}
for _n in ("int8", "uint8", "int16", "int32", "int64"):
  _i = np.iinfo(_n)
  SPECIAL[_n] = [_i.min, _i.max, 0, 1, _i.max - 1] + ([-1] if _i.min < 0 else [])


def fdt(name): return getattr(fg, name)
def tdt(name): return getattr(torch, name)


def source_bits(rng, name: str, shape) -> np.ndarray:
  """Random bits of dtype `name` (bools: 0 or 1) with its special values at random places, as its size's integers."""
  n = int(np.prod(shape))
  if name == "bool": return rng.integers(0, 2, n).astype(np.uint8).reshape(shape)
  bits = rng.integers(0, 256, n * SIZE[name], dtype=np.uint8).view(BITS[SIZE[name]])
  k = SIZE[name]
  sp = np.array([v % (1 << 8 * k) for v in SPECIAL[name]], np.uint64).astype(f"u{k}").view(BITS[k])
  bits[rng.choice(n, len(sp), replace=False)] = sp
  return bits.reshape(shape)


def fg_source(bits: np.ndarray, name: str, dev: str) -> fg.Tensor:
  """A realized fusegrad tensor of dtype `name` holding these bits (bfloat16, which numpy lacks, made on the device
  from int16 by a bit cast)."""
  if name == "bfloat16": return fg.tensor(bits, device=dev).view(fg.bfloat16).realize()
  arr = bits.astype(bool) if name == "bool" else bits.view(np.dtype(name))
  return fg.tensor(arr, device=dev).realize()


def torch_source(bits: np.ndarray, name: str) -> torch.Tensor:
  if name == "bool": return torch.from_numpy(bits.astype(bool))
  return torch.from_numpy(bits.copy()).view(tdt(name))


def fg_bits(y: fg.Tensor) -> np.ndarray:
  """The bits of a realized fusegrad tensor (bools as stored bytes)."""
  name = y.dtype.name
  if name == "bfloat16": return y.view(fg.int16).numpy()
  a = y.numpy()
  return a.view(np.uint8) if name == "bool" else a.view(BITS[SIZE[name]])


def assert_same_bits(got: fg.Tensor, want: torch.Tensor, label: str) -> None:
  assert tuple(got.shape) == tuple(want.shape) and got.dtype.name == str(want.dtype)[6:], label
  g = fg_bits(got)
  if want.dtype == torch.bool:   # torch keeps any byte; fusegrad's bool is the byte's truth value: 0 or 1
    assert set(np.unique(g)) <= {0, 1}, label
    np.testing.assert_array_equal(g, (want.view(torch.uint8) != 0).numpy().astype(np.uint8), err_msg=label)
  else:
    np.testing.assert_array_equal(g, want.view(tdt(BITS[want.element_size()].__name__)).numpy(), err_msg=label)


# ---- every pair torch allows -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("src", NAMES)
def test_every_pair(rng, dev, src):
  """src viewed as every other dtype (size-changing ones included: the last dim, 24, divides by every ratio), the
  results realized together (a kernel per result shape), bit for bit as torch's; and each viewed back."""
  bits = source_bits(rng, src, (5, 24))
  x, t = fg_source(bits, src, dev), torch_source(bits, src)
  assert_same_bits(x, t, f"{src} source")
  targets = [n for n in NAMES if n != src]
  ys = [x.view(fdt(n)) for n in targets]
  fg.realize(*ys)
  for n, y in zip(targets, ys):
    assert not y.requires_grad
    assert_same_bits(y, t.view(tdt(n)), f"{src} -> {n} on {dev}")
  # and back: the values of src again (a bool's bytes read as 0 or 1 on the way: torch's come back unchanged)
  back = [y.view(fdt(src)) for y in ys]
  fg.realize(*back)
  for n, b in zip(targets, back):
    want = t.view(tdt(n)).view(tdt(src))
    if n == "bool" and src != "bool": want = (t.view(torch.uint8) != 0).to(torch.uint8).view(tdt(src))
    assert_same_bits(b, want, f"{src} -> {n} -> {src} on {dev}")


@pytest.mark.parametrize("dev", DEVICES)
def test_chained_bit_casts_fold(rng, dev):
  """Same-size bit casts compose in the graph (x.view(int16).view(float16) is x's node: no kernel), except through
  a bool, whose byte reads as x != 0."""
  x = fg.tensor(rng.standard_normal(8).astype(np.float16), device=dev).realize()
  assert x.view(fg.int16).view(fg.float16).node is x.node
  assert x.view(fg.int16).view(fg.bfloat16).node.src[0] is x.node
  u = fg.tensor(np.array([0, 1, 2, 255], np.uint8), device=dev)
  np.testing.assert_array_equal(u.view(fg.bool).view(fg.int8).numpy(), [0, 1, 1, 1])
  np.testing.assert_array_equal(u.view(fg.int8).view(fg.uint8).numpy(), [0, 1, 2, 255])


@pytest.mark.parametrize("dev", DEVICES)
def test_constants(dev):
  """A constant's bit cast folds to the constant of the new dtype (a NaN's stays a BITCAST node: a literal keeps no
  payload)."""
  c = fg.full((2, 3), -2.5, device=dev)
  assert c.view(fg.int32).node.op == "CONST"
  np.testing.assert_array_equal(c.view(fg.int32).numpy(), torch.full((2, 3), -2.5).view(torch.int32).numpy())
  n = fg.full((4,), 0x7FA00001, dtype=fg.int32, device=dev).view(fg.float32)
  assert n.node.op == "BITCAST"
  np.testing.assert_array_equal(n.numpy().view(np.int32), np.full(4, 0x7FA00001, np.int32))
  np.testing.assert_array_equal(fg.full((2, 4), 1.5, dtype=fg.float16, device=dev).view(fg.uint8).numpy(),
                                torch.full((2, 4), 1.5, dtype=torch.float16).view(torch.uint8).numpy())


# ---- fused, vectorized ------------------------------------------------------------------------------------------

def _float_bits(rng, n) -> np.ndarray:
  a = rng.standard_normal(n).astype(np.float32)
  a[rng.choice(n, len(SPECIAL["float32"]), replace=False)] = np.array(SPECIAL["float32"], np.uint32).view(np.float32)
  return a


def _same_floats(got: np.ndarray, want: np.ndarray) -> None:
  """Bit for bit where either is a number; NaN where the other is (arithmetic on a NaN keeps no bit pattern torch
  promises)."""
  nan = np.isnan(want)
  np.testing.assert_array_equal(np.isnan(got), nan)
  np.testing.assert_array_equal(got[~nan].view(np.int32), want[~nan].view(np.int32))


@pytest.mark.parametrize("dev", DEVICES)
def test_fused_into_one_kernel(rng, dev):
  a = _float_bits(rng, 300)
  x, t = fg.tensor(a, device=dev).realize(), torch.from_numpy(a.copy())
  mask = 0x7FFFF000
  with fg.track() as tr:
    got = ((x.view(fg.int32) & mask).view(fg.float32) * 2).numpy()
  assert len(tr.kernels) == 1
  _same_floats(got, ((t.view(torch.int32) & mask).view(torch.float32) * 2).numpy())
  # a size-changing view in the middle of an expression: float32 -> bytes -> a byte's bits flipped -> float32
  with fg.track() as tr:
    got = ((x.view(fg.uint8) ^ 1).view(fg.float32) + 0).numpy()
  assert len(tr.kernels) == 1
  _same_floats(got, ((t.view(torch.uint8) ^ 1).view(torch.float32) + 0).numpy())
  # float16 bits in arithmetic: its sign bit cleared is abs
  h = rng.standard_normal((4, 32)).astype(np.float16)
  xh = fg.tensor(h, device=dev).realize()
  with fg.track() as tr:
    got = ((xh.view(fg.int16) & 0x7FFF).view(fg.float16) - xh.abs()).float().numpy()
  assert len(tr.kernels) == 1
  np.testing.assert_array_equal(got, np.zeros((4, 32), np.float32))


def test_vector_kernel(rng):
  """On the C device a large elementwise kernel's bit casts between float32 and int32 lanes are vector casts (the
  bits move, no lane converts): the kernel holds vectors and no scalar bit helper, and its bits are torch's."""
  a = _float_bits(rng, 1 << 16)
  x, t = fg.tensor(a, device="CPU").realize(), torch.from_numpy(a.copy())
  out = (x.view(fg.int32) & 0x7FFFF000).view(fg.float32) * 2
  (item,) = [it for it in create_schedule([out.node]) if it.kind == "KERNEL"]
  src = rd.get("CPU").compiled(item.kernel).source
  body = src[src.rindex(f"void {item.kernel.name}("):]
  assert re.search(r"\(\(fg_int32x\d+\)\(", body) and re.search(r"\(\(fg_float32x\d+\)\(", body), body
  assert "fg_f_bits" not in body and "fg_bits_f" not in body, body
  _same_floats(out.numpy(), ((t.view(torch.int32) & 0x7FFFF000).view(torch.float32) * 2).numpy())


# ---- through views, gradients, aliasing --------------------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
def test_views_torch_allows(rng, dev):
  """A slice whose last dim has stride 1, a transpose (same size), a broadcast row and an offset that divides the
  ratio: the same values as torch's."""
  a = rng.standard_normal((6, 8)).astype(np.float32)
  x, t = fg.tensor(a, device=dev), torch.from_numpy(a.copy())
  cases = [(lambda v: v[:, 2:6], torch.float64), (lambda v: v[1:, :4], torch.uint8), (lambda v: v.t(), torch.int32),
           (lambda v: v[:1].expand(3, 8), torch.float64), (lambda v: v[::2, 4:], torch.int16),
           (lambda v: v.t()[:, :3], torch.int32)]
  for i, (f, d) in enumerate(cases):
    want = f(t).view(d)
    got = f(x).view(fdt(str(d)[6:]))
    assert tuple(got.shape) == tuple(want.shape), i
    assert_same_bits(got, want, str(i))


def test_no_gradient_and_new_values():
  """As torch's view(dtype): no gradient flows through it (the result needs none); a view as the same dtype shares
  writes with its source (it is detach()), one as another dtype is a new value."""
  x = fg.randn(3, 4, requires_grad=True)
  tx = torch.randn(3, 4, requires_grad=True)
  for d in ("int32", "float16", "float64", "float32"):
    assert x.view(fdt(d)).requires_grad == tx.view(tdt(d)).requires_grad == False   # noqa: E712
    assert (x * 2).view(fdt(d)).requires_grad == (tx * 2).view(tdt(d)).requires_grad == False   # noqa: E712
  y = fg.zeros(4)
  y.view(fg.float32).add_(1)
  np.testing.assert_array_equal(y.numpy(), np.ones(4, np.float32))
  z = y.view(fg.int32)
  z.add_(1)
  np.testing.assert_array_equal(y.numpy(), np.ones(4, np.float32))   # (torch: y's bits + 1)


def test_empty():
  for shape in [(0,), (0, 2), (2, 0)]:
    for d in (torch.uint8, torch.int32):
      t = torch.zeros(shape)
      assert tuple(fg.zeros(shape).view(fdt(str(d)[6:])).shape) == tuple(t.view(d).shape)
  assert tuple(fg.zeros(0, 4).view(fg.float64).shape) == (0, 2)


# ---- errors -----------------------------------------------------------------------------------------------------

def _same_error(ffn, tfn):
  with pytest.raises(Exception) as te: tfn()
  with pytest.raises(type(te.value)) as fe: ffn()
  assert str(te.value).split("\n")[0] == str(fe.value).split("\n")[0]


@pytest.mark.parametrize("case", [
  lambda m: m.tensor(1.0).view(m.uint8),                       # 0-d, different sizes
  lambda m: m.tensor(1.5, dtype=m.float16).view(m.float32),
  lambda m: m.zeros(3).view(m.float64),                        # the last dim's size
  lambda m: m.zeros(2, 3, dtype=m.uint8).view(m.int32),
  lambda m: m.zeros(4, 3).t().view(m.float16),                 # the last dim's stride
  lambda m: m.zeros(4, 3).t().view(m.float64),
  lambda m: m.zeros(4, 4)[:, ::2].view(m.float16),
  lambda m: m.zeros(3, 4).t()[:, :1].view(m.uint8),
  lambda m: m.zeros(4, 4)[:, 1:3].view(m.float64),             # the storage offset
  lambda m: m.zeros(3, 5)[:, :4].view(m.float64),              # another dim's stride
  lambda m: m.zeros(2, 0).view(m.float64),
  lambda m: m.zeros(3, 1).view(m.float64),
  lambda m: m.zeros(4).view("int32"),                          # not a dtype
  lambda m: m.zeros(4).view(None),
])
def test_errors(case):
  _same_error(lambda: case(fg), lambda: case(torch))


def test_same_size_needs_no_layout():
  """Of the same itemsize a 0-d tensor and any layout are fine (elementwise), as torch's."""
  assert fg.tensor(1.0).view(fg.int32).item() == torch.tensor(1.0).view(torch.int32).item()
  assert tuple(fg.zeros(4, 3).t().view(fg.int32).shape) == (3, 4)
  for py, want in ((float, torch.float64), (int, torch.int64), (bool, torch.bool)):   # (Python's types: torch's)
    got, tw = fg.zeros(2, 8).view(py), torch.zeros(2, 8).view(py)
    assert got.dtype.name == str(want)[6:] == str(tw.dtype)[6:] and tuple(got.shape) == tuple(tw.shape)
