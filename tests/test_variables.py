"""Dimensions sized at run time (fusegrad.Variable, graph/dims.py): one compiled program serves every value of the
Variable; the loops over such a dim end at its value (a kernel argument) and every load, reduction and store over
it is guarded; buffers that hold such a dim are laid out at its bound, and `.numpy()` gives the logical values."""
from __future__ import annotations
import dataclasses
import re
import numpy as np
import pytest
import torch
import fusegrad as fg
from fusegrad.runtime import device as rd
from fusegrad.schedule import schedule as sched
from fusegrad.codegen.opt import Opt, OptOp
from tests.unit.kernels import one_kernel, run


def _attention(q, kc, vc, n):
  k, v = kc[:, :, :n], vc[:, :, :n]
  s = (q @ k.transpose(-1, -2)) * 0.17
  return s, s.softmax(-1) @ v


def _attention_ref(q, kc, vc, n):
  s = (q @ kc[:, :, :n].transpose(0, 1, 3, 2)) * np.float32(0.17)
  p = np.exp(s - s.max(-1, keepdims=True))
  return s, (p / p.sum(-1, keepdims=True)) @ vc[:, :, :n]


def test_kv_cache_attention_compiles_once(device, rng):
  """Decoding over a KV cache: attention over its first n positions for many n. After the first value (and the
  full length) no program is compiled; every value matches numpy, the scores read back at their logical shape."""
  B, H, MAX, D = 1, 3, 48, 16
  kc_np, vc_np = (rng.standard_normal((B, H, MAX, D)).astype(np.float32) for _ in range(2))
  kc, vc = fg.Tensor(kc_np, device=device).realize(), fg.Tensor(vc_np, device=device).realize()
  L = fg.Variable("L", 1, MAX)
  dev = rd.get(device)
  lengths = [int(x) for x in rng.choice(np.arange(2, MAX + 1), 6, replace=False)]
  programs = None
  for i, n in enumerate(lengths):
    q_np = rng.standard_normal((B, H, 1, D)).astype(np.float32)
    s, o = _attention(fg.Tensor(q_np, device=device), kc, vc, L.bind(n))
    assert s.shape == (B, H, 1, n) and type(s.shape[3]) is fg.graph.dims.BoundDim
    out = o.numpy()
    s_ref, o_ref = _attention_ref(q_np, kc_np, vc_np, n)
    np.testing.assert_allclose(out, o_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s.numpy(), s_ref, rtol=1e-4, atol=1e-5)   # a realized intermediate, read back
    if i == 0: programs = len(dev.programs)
    else: assert len(dev.programs) == programs, f"length {n} compiled a new program"


def test_runtime_loop_end_rendered():
  """The reduction's loop over a runtime size ends at its argument in the C source (not at the bound)."""
  x = fg.Tensor(np.ones((4, 64), np.float32)).realize()
  n = fg.Variable("n", 1, 64).bind(20)
  with fg.track() as t:
    y = x[:, :n].sum(1).numpy()
  np.testing.assert_allclose(y, np.full(4, 20.0))
  src = t.kernels[-1].source
  body = src[src.index("void " + t.kernels[-1].name):]
  loops = [c for c in re.findall(r"for \([^;]*;([^;]*);", body) if "gidx" not in c]   # (not the work items' loop)
  assert loops and all("p0" in cond for cond in loops), loops   # the reduction's loops end at the argument p0


@pytest.mark.parametrize("op,ref", [("sum", "sum"), ("amax", "max"), ("amin", "min"), ("prod", "prod"), ("mean", "mean"),
                                    ("argmax", "argmax"), ("logsumexp", None)])
def test_reductions_over_runtime_size(device, rng, op, ref):
  xn = rng.standard_normal((5, 40)).astype(np.float32)
  x = fg.Tensor(xn, device=device).realize()
  V = fg.Variable("n", 1, 40)
  for n in (7, 33, 40, 1):
    got = getattr(x[:, :V.bind(n)], op)(1).numpy()
    want = getattr(xn[:, :n], ref)(1) if ref else np.log(np.exp(xn[:, :n]).sum(1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_elementwise_output_and_views(device, rng):
  """An output with a runtime size (stored at the bound), then read as a leaf, through a permute and an expand."""
  xn = rng.standard_normal((6, 32)).astype(np.float32)
  yn = rng.standard_normal((32,)).astype(np.float32)
  x, y = fg.Tensor(xn, device=device).realize(), fg.Tensor(yn, device=device).realize()
  V = fg.Variable("n", 1, 32)
  for n in (5, 32, 17):
    nb = V.bind(n)
    a = (x[:, :nb] * 2 + y[:nb]).realize()
    assert a.shape == (6, n)
    np.testing.assert_allclose(a.numpy(), xn[:, :n] * 2 + yn[:n], rtol=1e-6)
    b = (a.T * 3).contiguous().realize()                                  # a permute of a stored runtime size
    np.testing.assert_allclose(b.numpy(), (xn[:, :n] * 2 + yn[:n]).T * 3, rtol=1e-6)
    c = a.sum(0, keepdim=True).expand(4, n) - a[:4]                      # an expand beside it
    np.testing.assert_allclose(c.numpy(), (xn[:, :n] * 2 + yn[:n]).sum(0, keepdims=True) - (xn[:4, :n] * 2 + yn[:n]),
                               rtol=1e-5, atol=1e-5)
    nw = x.narrow(1, 0, nb)                                                # narrow to a runtime length
    assert type(nw.shape[1]) is fg.graph.dims.BoundDim
    np.testing.assert_allclose((nw + 1).numpy(), xn[:, :n] + 1, rtol=1e-6)
    m = fg.arange(nb, device=device)                                       # arange of a runtime length
    assert m.shape == (n,) and type(m.shape[0]) is fg.graph.dims.BoundDim
    np.testing.assert_array_equal((m * 2).numpy(), np.arange(n) * 2)


def test_indexing_a_runtime_size_with_tensors(device, rng):
  """Integer-tensor indexing and gather read a tensor with a runtime size at its buffer's storage positions."""
  xn = rng.standard_normal((6, 30)).astype(np.float32)
  x = fg.Tensor(xn, device=device).realize()
  V = fg.Variable("n", 1, 30)
  for n in (7, 19):
    a = x[:, :V.bind(n)]
    cols, rows = rng.integers(0, n, 5), rng.integers(0, 6, 3)
    np.testing.assert_array_equal(a[:, fg.tensor(cols, device=device)].numpy(), xn[:, :n][:, cols])
    np.testing.assert_array_equal(a[fg.tensor(rows, device=device)].numpy(), xn[rows, :n])
    g = rng.integers(0, n, (6, 4))
    np.testing.assert_array_equal(a.gather(1, fg.tensor(g, device=device)).numpy(), np.take_along_axis(xn[:, :n], g, 1))


def test_two_values_of_one_variable_in_one_graph(rng):
  xn = rng.standard_normal((3, 30)).astype(np.float32)
  x = fg.Tensor(xn).realize()
  V = fg.Variable("n", 1, 30)
  got = (x[:, :V.bind(4)].sum(1) + x[:, :V.bind(19)].sum(1)).numpy()
  np.testing.assert_allclose(got, xn[:, :4].sum(1) + xn[:, :19].sum(1), rtol=1e-5, atol=1e-5)


def test_gradient_through_runtime_slice(rng):
  xn = rng.standard_normal((4, 24)).astype(np.float32)
  V = fg.Variable("n", 1, 24)
  for n in (9, 24):
    x = fg.Tensor(xn, requires_grad=True)
    (x[:, :V.bind(n)].exp() * 2).sum().backward()
    xt = torch.tensor(xn, requires_grad=True)
    (xt[:, :n].exp() * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts", [
    (), (Opt(OptOp.UPCAST, 1, 4),), (Opt(OptOp.UNROLL, 1, 8),), (Opt(OptOp.UPCAST, 1, 4), Opt(OptOp.UNROLL, 1, 2)),
    (Opt(OptOp.PADTO, 1, 48), Opt(OptOp.UPCAST, 1, 16)), (Opt(OptOp.GROUP, 1, 8),), (Opt(OptOp.LOCAL, 0, 2), Opt(OptOp.GROUP, 2, 4)),
])
def test_actions_on_a_runtime_axis(rng, opts):
  """Splitting, padding, unrolling and grouping a reduction over a runtime size keeps the result (the outer part
  ends at ceil(n / amount); the guards keep the inner indices past n out), on the interpreter."""
  xn = rng.standard_normal((6, 40)).astype(np.float32)
  x = fg.Tensor(xn, device="PYTHON").realize()
  V = fg.Variable("n", 1, 40)
  for n in (13, 40, 1):
    item = one_kernel(x[:, :V.bind(n)].sum(1))
    assert [a.end is not None for a in item.kernel.axes] == [False, True]
    np.testing.assert_allclose(run(item, opts), xn[:, :n].sum(1), rtol=1e-5, atol=1e-5)


def test_variable_errors():
  with pytest.raises(ValueError, match="bounds"): fg.Variable("n", 0, 8)
  with pytest.raises(ValueError, match="identifier"): fg.Variable("n m", 1, 8)
  V = fg.Variable("n", 1, 8)
  with pytest.raises(ValueError, match="outside its bounds"): V.bind(9)
  with pytest.raises(TypeError, match="integer"): V.bind(2.0)
  x = fg.Tensor(np.ones((4, 6), np.float32))
  with pytest.raises(IndexError, match="may reach 8, past dimension 1 of size 6"): x[:, :V.bind(3)]
  with pytest.raises(IndexError, match="needs start 0"): fg.Tensor(np.ones((4, 16), np.float32)).narrow(1, 2, V.bind(3))


def test_jit_refuses_a_runtime_size():
  x = fg.Tensor(np.ones((4, 16), np.float32)).realize()
  V = fg.Variable("n", 1, 16)

  @fg.jit
  def step(t, n): return (t[:, :V.bind(n)] * 2).sum(1)

  with pytest.raises(RuntimeError, match="Variable"):
    for _ in range(3): step(x, 5)


def test_kernel_cache_serves_every_value_once_verified(rng):
  """The lowering cache keys a runtime size by its Variable: the second value lowers once more to check that the
  kernel does not depend on the value, later values lower nothing."""
  xn = rng.standard_normal((8, 64)).astype(np.float32)
  x = fg.Tensor(xn).realize()
  V = fg.Variable("n_verified", 1, 64)   # a name of its own: cache entries of other tests are not this one's
  f = lambda n: (x[:, :V.bind(n)].exp() * 3).sum(1)
  f(10).numpy()
  verified, calls = sched.stats["bound_verified"], []
  real = sched._lower_judged
  def counted(*a):
    calls.append(1)
    return real(*a)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(sched, "_lower_judged", counted)
    for n in (11, 12, 40, 63):
      np.testing.assert_allclose(f(n).numpy(), (np.exp(xn[:, :n]) * 3).sum(1), rtol=1e-5)
  assert sched.stats["bound_verified"] == verified + 1
  assert len(calls) == 1


def test_kernel_cache_keys_by_value_when_lowering_depends_on_it(rng):
  """Where lowering gives another kernel for another value (here made to), the entry is keyed by value from then on:
  each value gets its own kernel, never another value's."""
  xn = rng.standard_normal((4, 50)).astype(np.float32)
  x = fg.Tensor(xn).realize()
  V = fg.Variable("n_by_value", 1, 50)
  real = sched._lower_judged
  def by_value(roots, is_boundary):   # a lowering whose result names the runtime size's value
    k, ins, params = real(roots, is_boundary)
    sizes = [int(d) for n in roots for d in n.shape if type(d) is fg.graph.dims.BoundDim]
    return dataclasses.replace(k, name=f"{k.name}_{'_'.join(map(str, sizes))}"), ins, params
  before = sched.stats["bound_by_value"]
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(sched, "_lower_judged", by_value)
    names = []
    for n in (7, 8, 9, 7, 8):
      with fg.track() as t:
        np.testing.assert_allclose((x[:, :V.bind(n)] * 5).numpy(), xn[:, :n] * 5, rtol=1e-6)
      names.append(t.kernels[-1].name)
  assert sched.stats["bound_by_value"] == before + 1
  assert names == [f"E_4_n_by_value_{n}" for n in (7, 8, 9, 7, 8)]
