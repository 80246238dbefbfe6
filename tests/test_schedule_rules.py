"""The scheduler's cost rules (fusegrad/schedule/rules.py): a matmul feeding a reduction is stored, a big
reduction into few outputs is split in two kernels (a scheduler rewrite), and every cut names the rule that made
it in the "why not fused" log. Kernel counts on the CPU device, values against numpy."""
from __future__ import annotations
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.codegen.opt import heuristic
from fusegrad.runtime.device import get as get_device
from fusegrad import config
from fusegrad.schedule import rules
from fusegrad.schedule import schedule as S

DEV = "CPU"


def realized(arr: np.ndarray, device: str = DEV) -> fg.Tensor:
  return fg.tensor(np.ascontiguousarray(arr), device=device).realize()


def randn(rng, *shape) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def fresh_caches():
  """Schedules and lowerings made from scratch (and none left behind that a patched rule decided)."""
  S._schedule_cache.clear(); S._lower_cache.clear()
  yield
  S._schedule_cache.clear(); S._lower_cache.clear()


# ---- a matmul feeding a reduction -------------------------------------------------------------------------------

# 128x192 @ 192x128: 16384 products (too few for a split), each a 192-element dot product
MATMUL_REDUCTIONS = {
  "sum": (lambda m: m.sum(), lambda m: m.sum()),
  "sum(0)": (lambda m: m.sum(0), lambda m: m.sum(0)),
  "mean(1)": (lambda m: m.mean(1), lambda m: m.mean(1)),
}


@pytest.mark.parametrize("name", list(MATMUL_REDUCTIONS))
def test_reduction_of_a_matmul_is_two_kernels(rng, name, fresh_caches):
  fn, ref = MATMUL_REDUCTIONS[name]
  a, b = randn(rng, 128, 192), randn(rng, 192, 128)
  ta, tb = realized(a), realized(b)
  S.stats.update(lower_calls=0)
  with fg.track() as t:
    out = fn(ta @ tb).numpy()
  assert len(t.kernels) == 2, [k.name for k in t.kernels]
  # the cut is decided by one pass over the graph before lowering: each kernel is lowered once
  assert S.stats["lower_calls"] == 2, S.stats
  # the matmul runs as a matmul: most of the work in a kernel with the work items a register tile leaves
  from fusegrad.codegen.opt import heuristic
  from fusegrad.runtime import device as rd
  mm = max(t.kernels, key=lambda k: k.flops)
  items = rd.get("CPU").caps.tile_items or heuristic.MIN_PARALLEL
  assert mm.flops >= 2 * 128 * 192 * 128 and np.prod(mm.global_size) >= items, (mm.name, mm.global_size)
  want = ref(a.astype(np.float64) @ b)
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-2 if name == "sum" else 1e-3)


@pytest.mark.parametrize("readers", ["norm and update", "two updates"])
def test_a_sum_of_reductions_is_one_kernel(rng, fresh_caches, readers):
  """A recurrent weight's gradient, the sum over the steps of dgates_t^T @ h_t (autograd's ADDs), read by two kernels
  (clip_grad_norm_'s norm, the update): one kernel computes every step's reduction and stores the sum, which both
  read (rules.reduction_sum). Before, each step's reduction was cut (nested under the norm's sum, or shared by the
  two readers): a kernel and a buffer each, and each reader added all of them up again (an LSTM of 35 steps: 70
  kernels, 35 [800, 200] buffers read twice). The log names the sum; values against numpy."""
  T = 6
  As, Bs = [randn(rng, 4, 64) for _ in range(T)], [randn(rng, 4, 16) for _ in range(T)]
  g = None
  for a, b in zip(As, Bs):
    m = realized(a).T @ realized(b)
    g = m if g is None else g + m
  p = realized(randn(rng, 64, 16))
  outs = [(g * g).sum(), p - 0.1 * g] if readers == "norm and update" else [p - 0.1 * g, p * g]
  with fg.track() as t:
    fg.realize(*outs)
  sums = [k for k in t.kernels if k.flops >= T * 2 * 4 * 64 * 16]
  assert len(sums) == 1 and len(t.kernels) <= 4, [k.name for k in t.kernels]
  want = sum(a.astype(np.float64).T @ b for a, b in zip(As, Bs))
  pn = p.numpy()
  got = [o.numpy() for o in outs]
  wants = [(want * want).sum(), pn - 0.1 * want] if readers == "norm and update" else [pn - 0.1 * want, pn * want]
  for x, w in zip(got, wants): np.testing.assert_allclose(x, w, rtol=1e-4, atol=1e-3)


def test_matmul_reduction_work_is_bounded(rng, fresh_caches):
  """Fused, (a @ b).sum() ran all of the matmul in one work item; cut, no kernel does more than a few dot products
  per work item, and the kernels' work adds up to about the matmul's."""
  n, k = 256, 256
  a, b = randn(rng, n, k), randn(rng, k, n)
  ta, tb = realized(a), realized(b)
  for fn in (lambda m: m.sum(), lambda m: m.sum(0), lambda m: m.mean(1)):
    with fg.track() as t:
      out = fn(ta @ tb).numpy()
    total = sum(r.flops for r in t.kernels)
    assert total <= 1.1 * (2 * n * k * n), total
    for r in t.kernels:
      # at most one register tile of dot products per work item
      caps = get_device(r.device).caps
      rows, vectors = heuristic.tile_shape(caps)
      tile = max(max(heuristic.TILE_ROWS) * heuristic.OUT_LANES * heuristic.COL_VECTORS,
                 rows[0] * vectors * heuristic.tile_lanes(caps))
      assert r.flops / np.prod(r.global_size) <= tile * 2 * k, (r.name, r.flops, r.global_size)
    np.testing.assert_allclose(out, fn(a.astype(np.float64) @ b), rtol=1e-4, atol=2e-2)


def test_small_nested_reduction_stays_fused(rng, fresh_caches):
  # a 4-element dot product summed over 16 rows: recomputing is cheaper than a second kernel
  c, d = randn(rng, 16, 4), randn(rng, 4, 3)
  tc, td = realized(c), realized(d)
  with fg.track() as t:
    out = (tc @ td).sum(0).numpy()
  assert len(t.kernels) == 1
  np.testing.assert_allclose(out, (c.astype(np.float64) @ d).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_a_reduction_broadcast_along_anothers_outputs_is_stored(rng, fresh_caches, mode):
  """Bilinear (bicubic) interpolation resamples each spatial dim by a product with a small matrix; the second
  product reads the first broadcast along its own outputs. Fused, every output summed the whole input window (a
  [8, 32, 64, 64] upsampling: 250 ms, torch 8); the first product is stored (nested_reduction) and each is a matmul.
  Values against torch (same float32 weights)."""
  import torch
  x = randn(rng, 2, 3, 20, 24)
  tx = realized(x)
  out = fg.nn.functional.interpolate(tx, scale_factor=2, mode=mode)
  whys = _whys(out)
  assert len(whys) == 2 and whys[0].startswith("nested_reduction: a reduction broadcast along another's outputs"), whys
  want = torch.nn.functional.interpolate(torch.tensor(x), scale_factor=2, mode=mode).numpy()
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
  # small ones stay one kernel (a reduction of 2 elements: under Params.nested_min)
  assert len(_whys(fg.nn.functional.interpolate(realized(randn(rng, 1, 1, 2, 2)), scale_factor=2, mode="bilinear"))) == 1


# ---- split reduce: a scheduler rewrite --------------------------------------------------------------------------

def test_big_sum_is_two_kernels_small_sum_one(rng, fresh_caches):
  x = rng.random(1 << 22, dtype=np.float32)
  tx = realized(x)
  for _ in range(2):   # the second realize replays the cached schedule (the partial results' buffer included)
    with fg.track() as t:
      got = tx.sum().item()
    assert len(t.kernels) == 2
    assert abs(got - x.astype(np.float64).sum()) <= 1e-6 * x.astype(np.float64).sum(), got
  fg.realize(tx.sum())          # the replay path without tracking (Plan.run)
  assert np.isclose(tx.sum().item(), x.astype(np.float64).sum(), rtol=1e-6)
  y = rng.random(1000, dtype=np.float32)
  ty = realized(y)
  with fg.track() as t:
    got = ty.sum().item()
  assert len(t.kernels) == 1
  assert np.isclose(got, y.astype(np.float64).sum(), rtol=1e-6)


def test_a_view_of_a_realized_reduction_beside_a_split(rng, fresh_caches):
  """A graph with a reduction to split (the rewrite then walks every node) that reads a reduction realized earlier
  through a view and a copy: the walk for a chunked contraction's views stops at the realized node (which keeps its
  op, not its sources). It ran into it: an IndexError in rules.chunks (a ResNet-18's gradients read one by one)."""
  a = rng.standard_normal((64, 256)).astype(np.float32)
  b = rng.standard_normal((256, 48)).astype(np.float32)
  c = rng.standard_normal(1 << 20).astype(np.float32)
  p = (fg.Tensor(a)[:, :, None] * fg.Tensor(b)[None]).sum(1, keepdim=True)
  p.realize()
  y = p.reshape(64, 48).t().contiguous() * 2 + fg.Tensor(c).sum()
  want = (a.astype(np.float64) @ b).T * 2 + c.astype(np.float64).sum()
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-3)


def test_an_accumulated_sum_is_stored_at_its_end(rng, fresh_caches):
  """A sum accumulated term by term (a recurrent layer's input gradient: each step's gate gradient, stored by its own
  kernel, padded into its place and added), read at its end by several kernels: stored once, where the chain of its
  only uses ends (schedule._chain_end). It was stored every few terms (each partial sum a full-size output of one
  kernel: the word LM's [35, 20, 800] gradients, 15 outputs, 2.1 ms a call)."""
  import re
  T = 35
  raw = [realized(rng.standard_normal((20, 64)).astype(np.float32)) for _ in range(T)]
  v = realized(rng.standard_normal((64, 16)).astype(np.float32))
  y = realized(rng.standard_normal((T * 20, 48)).astype(np.float32))
  w = realized(rng.standard_normal((64, 32)).astype(np.float32))
  parts = [(r * 0.5).tanh() * r for r in raw]
  side = [p @ v for p in parts]          # each step's value is stored by a kernel of its own
  s = None
  for i, p in enumerate(parts):
    t = p.reshape(1, 20, 64).pad((0, 0, 0, 0, i, T - 1 - i))
    s = t if s is None else s + t
  m = s.reshape(T * 20, 64)
  outs = [m.T @ y, m.sum(0), m @ w]
  with fg.track() as tr:
    fg.realize(*outs, *side)
  acc = [k for k in tr.kernels if k.name == "E_35_20_64"]
  assert len(acc) == 1, [k.name for k in tr.kernels]
  sig = acc[0].source[acc[0].source.rindex("void E_35_20_64("):].split(")")[0]
  assert len(re.findall(r"(?<!const )float\* restrict", sig)) == 1, sig
  full = np.concatenate([np.tanh(r.numpy() * 0.5)[None] * r.numpy()[None] for r in raw]).reshape(T * 20, 64)
  np.testing.assert_allclose(outs[0].numpy(), full.T @ y.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(outs[1].numpy(), full.sum(0), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(outs[2].numpy(), full @ w.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_split_half_sum_accumulates_in_float32(rng, dtype, fresh_caches):
  # 16-bit partial results would lose much of the sum (about 1640, where float16's spacing is 1 and bfloat16's 8):
  # float32 across both kernels, one rounding at the end
  x = (rng.random(1 << 16, dtype=np.float32) / 20).astype(np.float32)
  if dtype == "bfloat16":
    t = realized(x).to(fg.bfloat16)
    xs = t.float().numpy().astype(np.float64)
  else:
    xs = x.astype(np.float16)
    t = realized(xs)
    xs = xs.astype(np.float64)
  with fg.track() as tr:
    s = t.sum()
    got = s.float().item()
  assert s.dtype == (fg.bfloat16 if dtype == "bfloat16" else fg.float16)
  assert len(tr.kernels) == 2
  want = xs.sum()
  assert 1024 < want < 2048
  assert abs(got - want) <= (8 if dtype == "bfloat16" else 1) / 2 + 1e-3, (got, want)


def test_split_max_pads_with_the_identity(rng, fresh_caches):
  # 40007 elements do not divide into the partial results: the padding must not win a max of negative values
  x = -1 - rng.random(40007, dtype=np.float32)
  tx = realized(x)
  with fg.track() as t:
    got = tx.max().item(), tx.amin().item(), tx.sum().item()
  assert len(t.kernels) == 6
  assert got[0] == x.max() and got[1] == x.min()
  assert np.isclose(got[2], x.astype(np.float64).sum(), rtol=1e-6)


def test_split_keeps_outputs_and_integers(rng, fresh_caches):
  # 4 outputs of 2**15 elements each, reduced over a middle axis, in int64 (an int32 input sums as int64)
  x = rng.integers(-1000, 1000, (2, 1 << 15, 2)).astype(np.int32)
  tx = realized(x)
  with fg.track() as t:
    got = tx.sum(1).numpy()
  assert len(t.kernels) == 2
  assert got.dtype == np.int64
  np.testing.assert_array_equal(got, x.astype(np.int64).sum(1))


def test_split_is_device_parameterized(rng, fresh_caches, monkeypatch):
  x = rng.random(1 << 16, dtype=np.float32)
  tx = realized(x)
  monkeypatch.setitem(rules.DEVICE_PARAMS, "CPU", rules.Params(split_min=1 << 20))
  with fg.track() as t:
    got = tx.sum().item()
  assert len(t.kernels) == 1
  assert np.isclose(got, x.astype(np.float64).sum(), rtol=1e-5)


def test_split_sum_backward(rng, fresh_caches):
  x = rng.random((4, 1 << 14), dtype=np.float32)
  tx = fg.tensor(x, requires_grad=True)
  (tx * tx).sum().backward()
  np.testing.assert_allclose(tx.grad.numpy(), 2 * x, rtol=1e-6)


# ---- the "why not fused" log ------------------------------------------------------------------------------------

def _graphs(rng):
  t = lambda *s: realized(randn(rng, *s))
  a, b, x = t(128, 192), t(192, 128), t(64, 96)
  big = realized(rng.random(1 << 16, dtype=np.float32))
  h = (x @ t(96, 64) + t(64)).relu()
  return [
    [(a @ b).sum()],                                   # nested_reduction
    [big.sum(), big * big.sum()],                      # split_reduce
    [h @ t(64, 32), h.sum(0)],                         # shared_reduction
    [(x * 2).contiguous().exp()],                      # boundary
    [x.softmax(-1)],
    [fg.randn(64, 64, device=DEV) @ t(64, 64)],        # broadcast/tile rules on a computed operand
    [t(40, 10)[realized(rng.integers(0, 40, 8))] * 2],  # gather source
  ]


def test_every_cut_names_its_rule(rng, fresh_caches):
  seen = set()
  for outs in _graphs(rng):
    for it in S.create_schedule([o.node for o in outs]):
      for part in it.why.split("; "):
        rule = part.split(":")[0]
        assert part == "requested" or (rule in rules.RULES and part.startswith(rule + ": ") and len(part) > len(rule) + 2), it.why
        seen.add(rule if part != "requested" else part)
  assert {"requested", "nested_reduction", "split_reduce", "shared_reduction", "boundary"} <= seen, seen


def test_debug_log_prints_each_cut_with_its_rule(rng, fresh_caches, monkeypatch, capsys):
  monkeypatch.setattr(config, "DEBUG", 3)
  a, b = realized(randn(rng, 128, 192)), realized(randn(rng, 192, 128))
  out = (a @ b).sum()
  capsys.readouterr()
  S.create_schedule([out.node])
  lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("schedule:")]
  assert len(lines) == 2, lines
  assert "nested_reduction: a reduction recomputed in every iteration of another's loop" in lines[0]
  assert lines[1].endswith(": requested")


def test_rules_on_every_device(device, rng, fresh_caches):
  """The same cuts on every device (one table of parameters for now), and the same values."""
  a, b = randn(rng, 128, 192), randn(rng, 192, 128)
  x = rng.random((2, 40007), dtype=np.float32) - 0.5
  ta, tb, tx = realized(a, device), realized(b, device), realized(x, device)
  outs = [(ta @ tb).sum(), tx.sum(1), tx.amax(1)]
  with fg.track() as t:
    fg.realize(*outs)
  assert len(t.kernels) == 2 + 2 + 2, [k.name for k in t.kernels]
  np.testing.assert_allclose(outs[0].numpy(), (a.astype(np.float64) @ b).sum(), rtol=1e-4, atol=1e-2)
  np.testing.assert_allclose(outs[1].numpy(), x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)
  np.testing.assert_array_equal(outs[2].numpy(), x.max(1))


@pytest.mark.parametrize("width,kernels", [(64, ["r"]), (40, ["r", "r", "E"])])
def test_gpu_params_store_broadcast_reductions(monkeypatch, rng, width, kernels):
  """On a device that groups reductions (a GPU: Params.store_broadcast_reductions), softmax and layernorm are one
  kernel where a work-group can share a row's reductions and outputs (a row length with a power-of-two factor of
  heuristic.GROUP_MIN: 64); otherwise (40) each row reduction is stored by a kernel of its own (a work-group
  reduces it) and the outputs run elementwise."""
  import torch
  monkeypatch.setitem(rules.DEVICE_PARAMS, "PYTHON", rules.GPU)
  S._schedule_cache.clear(); S._lower_cache.clear()
  try:
    x = rng.standard_normal((16, width)).astype(np.float32)
    for f, tf in ((lambda t: t.softmax(-1), lambda t: t.softmax(-1)),
                  (lambda t: fg.nn.functional.layer_norm(t, (width,)),
                   lambda t: torch.nn.functional.layer_norm(t, (width,)))):
      with fg.track() as tr:
        got = f(fg.tensor(x, device="PYTHON")).numpy()
      assert [k.name[0] for k in tr.kernels] == kernels, [k.name for k in tr.kernels]
      np.testing.assert_allclose(got, tf(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
  finally:
    S._schedule_cache.clear(); S._lower_cache.clear()


def test_reductions_read_through_padding_are_stored(rng, fresh_caches):
  """cat([a.sum(1), b.sum(0)]): fused, each reduction's loop ran for every element of the cat, the other's
  included (padding is read as zero, its loop still runs); padded_reduction stores each, so the work is about the
  reductions' own."""
  a, b = randn(rng, 300, 500), randn(rng, 400, 200)
  with fg.track() as t:
    out = fg.cat([realized(a).sum(1), realized(b).sum(0)]).numpy()
  np.testing.assert_allclose(out, np.concatenate([a.sum(1), b.sum(0)]), rtol=1e-4, atol=1e-3)
  assert sum(r.flops for r in t.kernels) <= 1.2 * (a.size + b.size), [(r.name, r.flops) for r in t.kernels]
  items = S.create_schedule([fg.cat([realized(a).sum(1), realized(b).sum(0)]).node])
  assert any(it.why.startswith("padded_reduction") for it in items), [it.why for it in items]


# ---- operand layouts: a scheduler rewrite (rules.relayout) ---------------------------------------------------------

def _whys(out: fg.Tensor) -> list:
  return [it.why for it in S.create_schedule([out.node]) if it.kind == "KERNEL"]


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_transposed_column_operand_is_copied_first(rng, fresh_caches, device):
  """x @ w.T (a Linear layer): w.T's columns lie a row apart, so the scheduler copies it transposed first (one kernel
  more, logged as operand_layout) on every device; a small product or an already contiguous operand is one kernel."""
  x, w = randn(rng, 64, 256), randn(rng, 192, 256)
  out = realized(x, device) @ realized(w, device).T
  whys = _whys(out)
  assert len(whys) == 2 and whys[0].startswith("operand_layout: ") and "transposed" in whys[0], whys
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)
  assert len(_whys(realized(x[:8], device) @ realized(w, device).T)) == 1            # 8 rows: not worth a copy
  assert len(_whys(realized(x, device) @ realized(np.ascontiguousarray(w.T), device))) == 1


def test_batched_matmul_copies_its_shared_operand_once(rng, fresh_caches):
  """A batch of rows against one transposed matrix: the copy is the matrix's (its broadcast over the batch is not
  copied), and the gradients through the rewritten graph are the plain ones."""
  x, w = randn(rng, 4, 32, 128), randn(rng, 96, 128)
  tx, tw = fg.Tensor(x, requires_grad=True), fg.Tensor(w, requires_grad=True)
  out = tx @ tw.T
  items = [it for it in S.create_schedule([out.node]) if it.kind == "KERNEL"]
  assert items[0].why.startswith("operand_layout") and items[0].outputs[0].numel == w.size
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)
  g = randn(rng, 4, 32, 96)
  (out * fg.Tensor(g)).sum().backward()
  np.testing.assert_allclose(tx.grad.numpy(), g @ w, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(tw.grad.numpy(), np.einsum("bij,bik->jk", g, x), rtol=1e-4, atol=1e-3)


def test_large_matmul_reads_panels_on_vector_tile_devices(rng, fresh_caches):
  """A large float32 matmul on the CPU (caps: vector register tiles) reads b from panels of 16 columns copied first;
  the interpreter's device (work-groups) computes the same graph without them. Values equal numpy's either way."""
  a, b = randn(rng, 1024, 128), randn(rng, 128, 256)
  cpu = realized(a) @ realized(b)
  whys = _whys(cpu)
  lanes = max(fg.runtime.device.get("CPU").caps.vector_widths)   # 16 with AVX-512, 8 with AVX2
  assert len(whys) == 2 and f"panels of {lanes} columns" in whys[0], whys
  np.testing.assert_allclose(cpu.numpy(), a @ b, rtol=1e-4, atol=1e-4)
  py = realized(a, "PYTHON") @ realized(b, "PYTHON")
  assert len(_whys(py)) == 1
  np.testing.assert_allclose(py.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_row_operand_read_across_the_reduction_is_copied_first(rng, fresh_caches):
  """a.T @ b with a stored [k, n] (a weight gradient `g.T @ x`): rows a page apart per step of the reduction are
  copied with the reduction consecutive (logged as operand_layout) beside b's panels on the CPU; rows closer than a
  page in a narrow product or over a short reduction, and the interpreter's device, keep a as it is. Values and
  gradients against numpy."""
  lanes = max(fg.runtime.device.get("CPU").caps.vector_widths)
  a, b = randn(rng, 128, 1024), randn(rng, 128, 160)            # a.T's rows 4 KB apart
  ta, tb = fg.Tensor(a, requires_grad=True), fg.Tensor(b, requires_grad=True)
  out = ta.T @ tb
  whys = _whys(out)
  assert len(whys) == 3 and sum("row operand of a [1024x128] @ [128x160]" in wy for wy in whys) == 1 and \
      sum(f"panels of {lanes} columns" in wy for wy in whys) == 1, whys
  np.testing.assert_allclose(out.numpy(), a.T @ b, rtol=1e-4, atol=1e-3)
  g = randn(rng, 1024, 160)
  (out * fg.Tensor(g)).sum().backward()
  np.testing.assert_allclose(ta.grad.numpy(), b @ g.T, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(tb.grad.numpy(), a @ g, rtol=1e-4, atol=1e-3)
  near = realized(randn(rng, 128, 512)).T @ realized(randn(rng, 128, 256))   # 2 KB apart, 256 columns: kept
  assert not any("row operand" in wy for wy in _whys(near))
  wide = realized(randn(rng, 1024, 256)).T @ realized(randn(rng, 1024, 512))   # 1 KB apart, 512 columns: copied
  assert any("row operand" in wy for wy in _whys(wide))
  short = realized(randn(rng, 512, 64)).T @ realized(randn(rng, 512, 576))   # ... but not over a short reduction
  assert not any("row operand" in wy for wy in _whys(short))                 # (a convolution's weight gradient)
  py = realized(a, "PYTHON").T @ realized(b, "PYTHON")
  assert len(_whys(py)) == 1
  np.testing.assert_allclose(py.numpy(), a.T @ b, rtol=1e-4, atol=1e-3)


def test_panels_for_few_rows_padded_columns_and_long_contractions(rng, fresh_caches):
  """Panels from 16 rows (rules.PANEL_MIN_ROWS): `x @ w.T` for 32 rows packs w in panels (its transposed copy read
  rows a page apart per work item). Columns no multiple of the panel are padded to one (1004 as 1008: the product is
  stored padded, its reader takes the 1004 columns). A long contraction is laid out first, then chunked (chunked
  first, its column operand stayed a row apart and the product untiled). Values against numpy."""
  lanes = max(fg.runtime.device.get("CPU").caps.vector_widths)
  x, w = randn(rng, 32, 2048), randn(rng, 512, 2048)
  out = realized(x) @ realized(w).T
  whys = _whys(out)
  assert whys[0].startswith("operand_layout") and f"panels of {lanes} columns" in whys[0], whys
  assert any(wy.startswith("chunk_reduce") for wy in whys), whys
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-3)
  a, b = randn(rng, 64, 512), randn(rng, 512, 1004)   # (1004: no multiple of 8 or 16 lanes)
  out = realized(a) @ realized(b)
  whys = _whys(out)
  assert whys[0].startswith("operand_layout") and f"(padded to {1004 + (-1004) % lanes})" in whys[0], whys
  np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose((realized(a) @ realized(b)).relu().sum(0).numpy(), np.maximum(a @ b, 0).sum(0),
                             rtol=1e-4, atol=1e-2)
  # padded and long: the relaid product under its crop is chunked too (it ran at half the speed unchunked)
  x, w = randn(rng, 32, 4096), randn(rng, 1004, 4096)
  out = realized(x) @ realized(w).T
  whys = _whys(out)
  assert "padded to" in whys[0] and any(wy.startswith("chunk_reduce") for wy in whys), whys
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-3)


# ---- chunked contractions: a scheduler rewrite (rules.chunk) -------------------------------------------------------

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_long_contraction_is_computed_in_chunks(rng, fresh_caches, device):
  """A matmul whose reduction is long (a Linear layer's weight gradient over many rows: x.T @ g) computes
  [parts, outputs] partial results, each over a chunk of the reduction (parts outermost), then their sum; logged as
  chunk_reduce. Values match float64 numpy; a short reduction, and a long sum of squares (no operand shared by
  several outputs), stay one kernel."""
  P = rules.Params()
  n, k, m = 64, P.chunk_min * 2, P.chunk_outputs // 64
  x, g = randn(rng, k, n), randn(rng, k, m)
  out = realized(x, device).T @ realized(g, device)
  items = [it for it in S.create_schedule([out.node]) if it.kind == "KERNEL"]
  whys = [it.why for it in items]
  assert any(w.startswith("chunk_reduce: ") for w in whys), whys
  # the largest divisor of the reduced dim leaving chunk_len per chunk, partials at most 1/CHUNK_SHARE of the operands
  parts = min(k // P.chunk_len, (n + m) * k // (rules.CHUNK_SHARE * n * m))
  partial = next(it for it in items if it.why.startswith("chunk_reduce"))
  assert partial.outputs[0].numel == parts * n * m and parts >= 2, (parts, partial.outputs[0].shape)
  with fg.track() as t:
    got = out.numpy()
  assert len(t.kernels) == len(items)
  np.testing.assert_allclose(got, x.T.astype(np.float64) @ g, rtol=1e-4, atol=1e-3)
  short = realized(x[:P.chunk_min // 2], device).T @ realized(g[:P.chunk_min // 2], device)
  assert not any(w.startswith("chunk_reduce") for w in _whys(short))
  sq = realized(x, device).T
  assert not any(w.startswith("chunk_reduce") for w in _whys((sq * sq).sum(1)))
  few = realized(x[:, :8], device).T @ realized(g[:, :8], device)      # 64 outputs: few tiles, one pass
  assert not any(w.startswith("chunk_reduce") for w in _whys(few))


def test_conv_weight_gradient_is_chunked_and_matches_torch(rng, fresh_caches):
  """A 3x3 convolution's weight gradient over a batch's positions (8 x 40 x 40 = 12800 per weight) runs in chunks of
  images; both gradients match torch's."""
  torch = pytest.importorskip("torch")
  x, w, g = randn(rng, 8, 16, 40, 40), randn(rng, 64, 16, 3, 3) * 0.1, randn(rng, 8, 64, 40, 40)
  tx, tw = fg.Tensor(x, requires_grad=True), fg.Tensor(w, requires_grad=True)
  (fg.nn.functional.conv2d(tx, tw, padding=1) * fg.Tensor(g)).sum().backward()
  whys = [it.why for it in S.create_schedule([tw.grad.node]) if it.kind == "KERNEL"]
  assert any(w_.startswith("chunk_reduce: ") for w_ in whys), whys
  rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  (torch.nn.functional.conv2d(rx, rw, padding=1) * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(tw.grad.numpy(), rw.grad.numpy(), rtol=1e-4, atol=2e-3)
  np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_gather_inside_a_reduction_is_stored(rng, fresh_caches):
  """An embedding's rows summed over the tokens (a bias or layer-norm weight gradient reading the embedding's output)
  would keep the reduction scalar and reload the indices in every kernel that reads them: the gathered rows get a
  kernel of their own (logged as gathered_reduction); a small gather stays fused. Values as numpy's."""
  table, idx = randn(rng, 100, 64), rng.integers(0, 100, 512)
  g = randn(rng, 512, 64)
  out = (fg.tensor(table)[fg.tensor(idx)] * fg.tensor(g)).sum(0)
  whys = _whys(out)
  assert any(w.startswith("gathered_reduction: ") for w in whys), whys
  np.testing.assert_allclose(out.numpy(), (table[idx].astype(np.float64) * g).sum(0), rtol=1e-4, atol=1e-4)
  small = (fg.tensor(table)[fg.tensor(idx[:8])] * fg.tensor(g[:8])).sum(0)
  assert not any(w.startswith("gathered_reduction") for w in _whys(small))


def test_column_sum_reads_whole_rows(rng, fresh_caches):
  """A sum over the rows of a narrow matrix (a bias gradient) takes several column vectors per work item, so each
  reads stretches of its rows rather than one cache line of each (heuristic.COLUMN_SUM_VECTORS)."""
  from fusegrad.codegen.opt import OptOp
  x = randn(rng, 2048, 128)
  with fg.track() as t:
    got = realized(x).sum(0).numpy()
  assert len(t.kernels) == 1
  ups = [o.arg for o in t.kernels[0].opts if o.op is OptOp.UPCAST]
  assert ups[0] == heuristic.tile_lanes(get_device("CPU").caps) and ups[1] > 1, t.kernels[0].opts
  np.testing.assert_allclose(got, x.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)


def test_an_exp_row_operand_no_turned_tile_holds_is_stored(rng, fresh_caches):
  """Attention's softmax feeding its product with v: where the turned tile (the rows in vector lanes, every column an
  accumulator) holds v's columns, the softmax stays fused into the product; where it cannot (more columns than the
  machine's accumulators), the softmax is stored (logged as tile_operands) and the product reads it as plain loads.
  Values as numpy's either way; a device with work-groups keeps the fusion."""
  import fusegrad.nn.functional as F
  caps = get_device(DEV).caps
  def attend(d):   # a training step's attention: the softmax's max and sum are stored for the backward
    q, k, v = randn(rng, 16, 2, 64, d), randn(rng, 16, 2, 64, d), randn(rng, 16, 2, 64, d)
    tv = fg.tensor(v, requires_grad=True)
    out = F.scaled_dot_product_attention(realized(q), realized(k), tv)
    out.sum().backward()
    s = (q.astype(np.float64) @ k.swapaxes(-1, -2)) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    whys = [it.why for it in S.create_schedule([out.node, tv.grad.node]) if it.kind == "KERNEL"]
    np.testing.assert_allclose(out.numpy(), p @ v, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tv.grad.numpy(), p.swapaxes(-1, -2).sum(-1, keepdims=True).repeat(d, -1),
                               rtol=1e-4, atol=1e-4)
    return whys
  wide = 16 * (heuristic.accumulator_vectors(caps) // 16 + 1)   # whole vectors of columns, more than the accumulators
  for d, stored in ((wide, True), (8, False)):
    whys = attend(d)
    assert any(w.startswith("tile_operands: a row operand computing an exp") for w in whys) == stored, (d, whys)
  class Wide:   # a product's column variable, as the rule reads it
    hi = 1 << 20
  assert not rules._turnable(DEV, Wide) and (not _has("OPENCL") or rules._turnable("OPENCL", Wide))


def _has(device: str) -> bool:
  try:
    get_device(device)
    return True
  except Exception:
    return False
