"""Kernel counts of common patterns on the CPU device, with their values checked against numpy.

Inputs are realized before the `fusegrad.track()` block, so the block counts only the kernels of
the op under test. Counts marked "pinned" are the current count where the spec allows more: a
change in either direction should be a deliberate one.
"""
from __future__ import annotations
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.graph import node as gn
from fusegrad.schedule.schedule import create_schedule

DEV = "CPU"


def realized(arr: np.ndarray) -> fg.Tensor:
  return fg.tensor(np.ascontiguousarray(arr), device=DEV).realize()


def run(fn):
  """(numpy value, tracker) of fn()'s result, realized inside a track() block."""
  with fg.track() as t:
    out = fn().numpy()
  return out, t


def randn(rng, *shape) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)


# ---- elementwise, reduce, matmul ------------------------------------------------------------------------

def test_elementwise_chain_is_one_kernel(rng):
  a, b, c = (randn(rng, 16, 33) for _ in range(3))
  ta, tb, tc = map(realized, (a, b, c))
  out, t = run(lambda: ((ta + tb) * tc).exp())
  assert len(t.kernels) == 1
  np.testing.assert_allclose(out, np.exp((a + b) * c), rtol=1e-5, atol=1e-6)


def test_mul_then_sum_is_one_kernel(rng):
  a, b = randn(rng, 16, 40), randn(rng, 16, 40)
  ta, tb = realized(a), realized(b)
  out, t = run(lambda: (ta * tb).sum(1))
  assert len(t.kernels) == 1
  assert out.shape == (16,)
  np.testing.assert_allclose(out, (a.astype(np.float64) * b).sum(1), rtol=1e-5, atol=1e-5)


def test_linear_relu_is_one_kernel(rng):
  x, w, b = randn(rng, 32, 64), randn(rng, 64, 48), randn(rng, 48)
  tx, tw, tb = map(realized, (x, w, b))
  out, t = run(lambda: (tx @ tw + tb).relu())
  assert len(t.kernels) == 1
  np.testing.assert_allclose(out, np.maximum(x.astype(np.float64) @ w + b, 0), rtol=1e-4, atol=1e-4)


# ---- softmax / layernorm -------------------------------------------------------------------------------

def np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_layernorm(x, g, b, eps=1e-5):
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) / np.sqrt(v + eps) * g + b


def fg_layernorm(x, g, b, eps=1e-5):
  m = x.mean(-1, keepdim=True)
  v = ((x - m) ** 2).mean(-1, keepdim=True)
  return (x - m) / (v + eps).sqrt() * g + b


@pytest.mark.parametrize("shape", [(128, 64), (4, 8), (2, 3, 50)])
def test_softmax_last_axis_is_one_kernel(rng, shape):
  # spec: <= 2 kernels; pinned at the current 1 (max and sum reused per row inside one kernel)
  x = randn(rng, *shape) * 3
  tx = realized(x)
  out, t = run(lambda: tx.softmax(-1))
  assert len(t.kernels) == 1
  np.testing.assert_allclose(out, np_softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(128, 64), (4, 8), (2, 3, 50)])
def test_layernorm_is_one_kernel(rng, shape):
  # spec: <= 3 kernels; pinned at the current 1
  n = shape[-1]
  x, g, b = randn(rng, *shape) * 2 + 1, randn(rng, n), randn(rng, n)
  tx, tg, tb = map(realized, (x, g, b))
  out, t = run(lambda: fg_layernorm(tx, tg, tb))
  assert len(t.kernels) == 1
  np.testing.assert_allclose(out, np_layernorm(x.astype(np.float64), g, b), rtol=1e-4, atol=1e-4)


# ---- big reductions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_full_sum_of_1e7_is_two_kernels_and_accurate(rng, dist):
  n = 10 ** 7
  a = rng.random(n, dtype=np.float32) if dist == "uniform" else rng.standard_normal(n, dtype=np.float32)
  ta = realized(a)
  with fg.track() as t:
    got = ta.sum().item()
  assert len(t.kernels) == 2
  ref = a.astype(np.float64).sum()
  # a split (two-level) float32 sum stays within a few 1e-7 of sum|x|; a naive float32 loop is ~2e-5 off
  scale = np.abs(a).astype(np.float64).sum()
  assert abs(got - ref) <= 5e-6 * scale, (got, ref)


def test_x_times_full_sum_is_two_kernels(rng):
  # big enough that the sum is not fused serially into the elementwise kernel (rules.Params.serial_ok), small
  # enough not to be split in two (rules.Params.split_min)
  x = randn(rng, 128, 128)
  tx = realized(x)
  out, t = run(lambda: tx * tx.sum())
  assert len(t.kernels) == 2
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(out, x64 * x64.sum(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_argmax_is_one_kernel(rng, dim):
  x = randn(rng, 24, 37)
  tx = realized(x)
  out, t = run(lambda: tx.argmax(dim))
  assert len(t.kernels) == 1
  np.testing.assert_array_equal(out, np.argmax(x, axis=dim))


@pytest.mark.parametrize("dim", [0, 1])
def test_cat_of_three_is_one_kernel(rng, dim):
  a, b, c = randn(rng, 3, 5), randn(rng, 3, 5), randn(rng, 3, 5)
  if dim == 0: b = randn(rng, 7, 5)
  else: c = randn(rng, 3, 2)
  tensors = list(map(realized, (a, b, c)))
  out, t = run(lambda: fg.cat(tensors, dim))
  assert len(t.kernels) == 1
  np.testing.assert_array_equal(out, np.concatenate([a, b, c], dim))


# ---- views --------------------------------------------------------------------------------------------

def test_strided_view_of_permuted_buffer_is_one_kernel_without_copy(rng):
  x = randn(rng, 6, 8)
  tx = realized(x)
  y = tx.permute(1, 0).reshape(-1)[::2] + 1
  # the schedule is one kernel that reads the original buffer itself
  sched = create_schedule([gn.contiguous(y.node)])
  assert [it.kind for it in sched] == ["KERNEL"]
  assert len(sched[0].inputs) == 1 and sched[0].inputs[0] is tx.node
  with fg.track() as t:
    out = y.numpy()
  assert len(t.kernels) == 1 and t.copies == 0
  k = t.kernels[0]
  assert k.bytes == (24 + 48) * 4          # reads the 48-element original, writes 24
  assert "b1[gidx]" not in k.source and "b1[" in k.source   # the transpose lives in the load's index
  np.testing.assert_array_equal(out, x.T.reshape(-1)[::2] + 1)


def test_movement_ops_launch_nothing(rng):
  x = randn(rng, 4, 6, 5)
  tx = realized(x)
  with fg.track() as t:
    views = [tx.permute(2, 0, 1), tx.reshape(24, 5), tx.permute(2, 0, 1).reshape(-1), tx.pad((1, 2, 0, 1)),
             tx[1:3, ::2, ::-1], tx.flip(0, 2), tx[:, None].expand(4, 3, 6, 5), tx.transpose(0, 1).reshape(6, 20),
             tx.unsqueeze(0).squeeze(0), tx[2], tx.narrow(1, 1, 3).flip(1).permute(1, 2, 0)]
  assert t.kernels == [] and t.copies == 0
  assert all(not v.node.realized for v in views if v.node is not tx.node)
  refs = [x.transpose(2, 0, 1), x.reshape(24, 5), x.transpose(2, 0, 1).reshape(-1),
          np.pad(x, ((0, 0), (0, 1), (1, 2))), x[1:3, ::2, ::-1], x[::-1, :, ::-1],
          np.broadcast_to(x[:, None], (4, 3, 6, 5)), x.transpose(1, 0, 2).reshape(6, 20), x, x[2],
          x[:, 1:4][:, ::-1].transpose(1, 2, 0)]
  for v, r in zip(views, refs):
    with fg.track() as t:
      out = v.numpy()
    assert len(t.kernels) <= 1      # reading a view back is at most the one copy kernel
    np.testing.assert_array_equal(out, r)


def test_views_compose_into_one_kernel(rng):
  x = randn(rng, 4, 6, 5)
  tx = realized(x)
  with fg.track() as t:
    v = tx.permute(2, 0, 1).reshape(5, 24).pad((2, 1, 0, 3))[1:7, 3:20].flip(1).reshape(6, 17, 1)
    v = v.permute(2, 1, 0).reshape(17, 6)[::-1, 1::2].pad((1, 0, 2, 2)) * 2
  assert t.kernels == []
  with fg.track() as t:
    out = v.numpy()
  assert len(t.kernels) == 1 and t.copies == 0
  r = np.pad(x.transpose(2, 0, 1).reshape(5, 24), ((0, 3), (2, 1)))[1:7, 3:20][:, ::-1].reshape(6, 17, 1)
  r = np.pad(r.transpose(2, 1, 0).reshape(17, 6)[::-1, 1::2], ((2, 2), (1, 0))) * 2
  np.testing.assert_array_equal(out, r)


# ---- laziness and hash-consing ---------------------------------------------------------------------------

def test_ops_are_lazy_until_a_value_is_needed(rng):
  a, b = randn(rng, 8, 9), randn(rng, 9)
  ta, tb = realized(a), realized(b)
  with fg.track() as t:
    y = ((ta + tb).exp() * 2).sum(0).relu()
    z = y.reshape(3, 3).permute(1, 0) @ y.reshape(3, 3)
    s = z.max()
    assert t.kernels == [], "building the graph launched kernels"
    assert not y.node.realized and not z.node.realized
    zv = z.numpy()
    n_after_numpy = len(t.kernels)
    assert n_after_numpy >= 1
    sv = s.item()
    assert len(t.kernels) > n_after_numpy
    y.realize()
  assert y.node.realized
  yr = np.maximum((np.exp(a.astype(np.float64) + b) * 2).sum(0), 0)
  zr = yr.reshape(3, 3).T @ yr.reshape(3, 3)
  np.testing.assert_allclose(y.numpy(), yr, rtol=1e-5)
  np.testing.assert_allclose(zv, zr, rtol=1e-5)
  assert sv == pytest.approx(zr.max(), rel=1e-5)


def test_realized_tensor_is_not_recomputed(rng):
  a = randn(rng, 8, 9)
  ta = realized(a)
  y = (ta * 3).sin().realize()
  with fg.track() as t:
    v1, v2 = y.numpy(), y.numpy()
  assert t.kernels == []
  np.testing.assert_allclose(v1, np.sin(a * np.float32(3)), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(v1, v2)


def test_hash_consing(rng):
  ta, tb = realized(randn(rng, 5)), realized(randn(rng, 5))
  assert (ta + tb).node is (ta + tb).node
  assert ((ta + tb) * ta).exp().node is ((ta + tb) * ta).exp().node
  assert ta.permute(0).reshape(5, 1).node is ta.reshape(5, 1).node
  assert (ta + tb).node is not (ta - tb).node
  # one node shared by two consumers is computed once, in one kernel
  s = ta + tb
  with fg.track() as t:
    out = (s * s).numpy()
  assert len(t.kernels) == 1
  np.testing.assert_allclose(out, (ta.numpy() + tb.numpy()) ** 2, rtol=1e-6)


def test_adam_update_is_one_kernel_with_three_outputs(rng):
  # parameter, first and second moment of one Adam step: elementwise kernels of one shape that read
  # each other's outputs become one kernel that stores all three
  p0, g0 = randn(rng, 64, 48), randn(rng, 64, 48)
  m0, v0 = randn(rng, 64, 48) * 0.1, np.abs(randn(rng, 64, 48)) * 0.01
  p, g, m, v = (realized(a) for a in (p0, g0, m0, v0))
  b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
  m2 = m * b1 + g * (1 - b1)
  v2 = v * b2 + g * g * (1 - b2)
  p2 = p - lr * (m2 / (1 - b1)) / ((v2 / (1 - b2)).sqrt() + eps)
  with fg.track() as t:
    fg.realize(p2, m2, v2)
  assert len(t.kernels) == 1
  m_ref = m0 * b1 + g0 * (1 - b1)
  v_ref = v0 * b2 + g0 * g0 * (1 - b2)
  p_ref = p0 - lr * (m_ref / (1 - b1)) / (np.sqrt(v_ref / (1 - b2)) + eps)
  np.testing.assert_allclose(m2.numpy(), m_ref, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(v2.numpy(), v_ref, rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(p2.numpy(), p_ref, rtol=1e-5, atol=1e-6)


def test_shared_matmul_stores_its_activation(rng):
  # h = relu(x @ w + b) read by two kernels: the matmul's kernel stores h itself (the bias and the relu are its
  # epilogue), so neither reader recomputes them and nothing stores the bare product
  x, w, b, w2 = randn(rng, 64, 96), randn(rng, 96, 64), randn(rng, 64), randn(rng, 64, 32)
  tx, tw, tb, tw2 = map(realized, (x, w, b, w2))
  h = (tx @ tw + tb).relu()
  outs = [h @ tw2, h.sum(0)]
  items = create_schedule([o.node for o in outs])
  assert len(items) == 3
  assert items[0].outputs[0] is h.node and items[0].outputs[0].op == "WHERE"
  assert not any(o.op == "REDUCE" for it in items for o in it.outputs if o.shape == (64, 1, 64))
  hr = np.maximum(x.astype(np.float64) @ w + b, 0)
  fg.realize(*outs)
  np.testing.assert_allclose(outs[0].numpy(), hr @ w2, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(outs[1].numpy(), hr.sum(0), rtol=1e-4, atol=1e-3)


def test_linear_weight_gradient_is_computed_in_the_weights_layout(rng):
  # Linear computes x @ w.T; w's gradient g.T @ x comes out as [out, in] like w, so the optimizer's update (one
  # elementwise kernel over w) reads it contiguously
  lin = fg.nn.Linear(48, 32).to(DEV)
  x = realized(randn(rng, 64, 48))
  opt = fg.optim.SGD(lin.parameters(), lr=0.1)
  lin(x).square().mean().backward()
  with fg.track() as t: opt.step()
  shapes = [k.name for k in t.kernels]
  assert "r_32_48" in shapes and "r_48_32" not in shapes, shapes


def test_reduction_of_a_matmul_stores_the_matmul(rng):
  """(a @ b).sum(): fused, the matmul's reduction ran inside the sum's loop, serially and unblocked (22 s for
  2048²); the matmul gets its own (parallel, register-blocked) kernel and the sum reads its output."""
  a, b = randn(rng, 256, 128), randn(rng, 128, 192)
  ta, tb = realized(a), realized(b)
  out, t = run(lambda: (ta @ tb).sum())
  assert len(t.kernels) >= 2
  assert any(k.name.startswith("r_256_1_192") for k in t.kernels), [k.name for k in t.kernels]
  np.testing.assert_allclose(out, (a.astype(np.float64) @ b).sum(), rtol=1e-4, atol=1e-2)
  # a small nested reduction stays fused: sum over rows of a 4-element dot product
  c, d = randn(rng, 16, 4), randn(rng, 4, 3)
  tc, td = realized(c), realized(d)
  out, t = run(lambda: (tc @ td).sum(0))
  assert len(t.kernels) == 1
  np.testing.assert_allclose(out, (c @ d).sum(0), rtol=1e-4, atol=1e-4)


def test_linear_input_gradient_through_a_flatten_is_tiled(rng):
  """A Linear layer's input gradient after a flatten is g @ w stored shaped as the [n, c, h, w] activation (the
  MNIST convnet's fc1, whose innermost axis of 12 left it scalar and untiled: 13 ms of a 25 ms step). Lowering merges
  the output axes every index reads as one (codegen/lower.merge_axes): the kernel gets a register tile whose column
  vectors lie on the merged c*h*w axis. Its operand 2 * y (the square's gradient) is stored for the tile
  (rules.tile_operands), as for any tiled matmul: three kernels, and the loss's sum computed with them (a loss that
  backward ran from is computed by the next realize: autograd.backward). Values match torch."""
  import torch
  from fusegrad.codegen.opt import heuristic
  from fusegrad.runtime import device as rd
  x, w = randn(rng, 8, 16, 12, 12), randn(rng, 128, 2304) / 48
  tx = fg.tensor(x, device=DEV, requires_grad=True).realize()
  tw = fg.tensor(w, device=DEV, requires_grad=True).realize()
  loss = fg.nn.functional.linear(fg.flatten(tx, 1), tw).square().sum()
  with fg.track() as t:
    loss.backward()
    gx = tx.grad.numpy()
    lv = loss.item()
  assert len(t.kernels) == 4 and t.kernels[-1].name == "r_scalar", [k.name for k in t.kernels]   # pinned
  k = next(k for k in t.kernels if k.name == "r_8_16_12_12")
  lanes = heuristic.tile_lanes(rd.get(DEV).caps)
  assert any(o.op.name == "UPCAST" and o.arg == lanes for o in k.opts) and len(k.opts) >= 2, k.opts
  assert k.flops <= 2 * 8 * 2304 * 128 * 1.01, k.flops   # g @ w once (fused with 2 * y it recomputed y per element)
  rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  tl = torch.nn.functional.linear(torch.flatten(rx, 1), rw).square().sum()
  tl.backward()
  np.testing.assert_allclose(gx, rx.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(lv, tl.item(), rtol=1e-4)


def test_a_big_window_gradient_is_stored_once():
  import torch
  """A max-pool's input gradient sums its windows' spread gradients (9 guarded reads an element for 3x3 stride 2):
  stored once from autograd.UNFOLD_GRAD_STORE elements on, so the batch norm behind it reads it in each of its
  gradient kernels instead of recomputing it there (ResNet-18's step)."""
  import fusegrad.autograd as A
  import fusegrad.nn.functional as F
  rng = np.random.default_rng(0)
  a = rng.standard_normal((4, 8, 32, 32)).astype(np.float32)
  for store in (True, False):
    x = fg.tensor(a, requires_grad=True).realize()
    old, A.UNFOLD_GRAD_STORE = A.UNFOLD_GRAD_STORE, (A.UNFOLD_GRAD_STORE if store else 1 << 40)
    try:
      p = F.max_pool2d(F.batch_norm(x, None, None, training=True), 3, 2, 1)
      (p * p).sum().backward()
    finally:
      A.UNFOLD_GRAD_STORE = old
    with fg.track() as t: x.grad.realize()
    # reductions (the batch norm's gradient sums) that recompute the windows' spread gradient (stride-2 conditions)
    spread = [k.name for k in t.kernels
              if k.name.startswith("r_") and "%2)" in k.source.split("void " + k.name + "(")[-1]]
    padded = [k.name for k in t.kernels if k.name == "E_4_8_34_34"]
    if store: assert padded == ["E_4_8_34_34"] and spread == [], (padded, spread)   # computed once, stored
    else: assert padded == [] and len(spread) >= 1, spread                          # recomputed per reader
    tx = torch.tensor(a.astype(np.float64), requires_grad=True)
    tp = torch.nn.functional.max_pool2d(torch.nn.functional.batch_norm(tx, None, None, training=True), 3, 2, 1)
    (tp * tp).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4 * np.abs(tx.grad.numpy()).max())
