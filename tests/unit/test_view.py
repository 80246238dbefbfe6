"""graph/view.View: movement ops against numpy, element by element (no compiler, no device)."""
from __future__ import annotations
import itertools
import random
import numpy as np
import pytest
from fusegrad.graph.view import View


def evaluate(v: View, base: np.ndarray) -> np.ndarray:
  """The values a view reads from a flat base (0 where its mask says invalid)."""
  out = np.zeros(v.shape, dtype=base.dtype)
  for idx in itertools.product(*[range(s) for s in v.shape]):
    if v.mask is not None and not all(lo <= i < hi for i, (lo, hi) in zip(idx, v.mask)): continue
    out[idx] = base[v.offset + sum(i * st for i, st in zip(idx, v.strides))]
  return out


def padded(rng, shape, pad_dims) -> tuple[View, list]:
  v = View.contiguous(shape)
  pads = [(int(rng.integers(0, 3)), int(rng.integers(0, 3))) if d in pad_dims else (0, 0) for d in range(len(shape))]
  return v.pad(pads), pads


def test_reshape_merges_whole_dims_of_a_padded_view():
  """A padded map's batch and channel dims merge (a window view over it then indexes by strides): the masked dims
  keep their sizes, the whole ones merge and split as an unmasked view's."""
  base = np.arange(1, 2 * 3 * 4 * 5 + 1, dtype=np.float64)
  v = View.contiguous((2, 3, 4, 5)).pad([(0, 0), (0, 0), (1, 1), (1, 2)])
  r = v.reshape((6, 6, 8))
  assert r is not None and r.mask == ((0, 6), (1, 5), (1, 6))
  np.testing.assert_array_equal(evaluate(r, base), evaluate(v, base).reshape(6, 6, 8))
  back = r.reshape((2, 3, 6, 8))
  assert back is not None
  np.testing.assert_array_equal(evaluate(back, base), evaluate(v, base))
  assert v.reshape((2, 3, 48)) is None            # a masked dim merged: no per-dim mask expresses it
  assert v.reshape((2, 3, 3, 2, 8)) is None       # a masked dim split
  assert v.reshape((1, 6, 1, 6, 8)) is not None   # size-1 dims come and go


@pytest.mark.parametrize("seed", range(12))
def test_reshape_of_masked_views_matches_numpy(seed):
  """Random padded (and permuted) views reshaped by every regrouping of their dims: whenever reshape answers a
  view it reads what numpy's reshape of the values holds."""
  rng = np.random.default_rng(seed)
  nd = int(rng.integers(2, 5))
  shape = tuple(int(rng.integers(1, 4)) for _ in range(nd))
  v, _ = padded(rng, shape, set(rng.choice(nd, size=int(rng.integers(1, nd + 1)), replace=False).tolist()))
  if rng.random() < 0.3: v = v.permute(tuple(rng.permutation(nd).tolist()))
  base = rng.standard_normal(int(np.prod(shape))) + 10
  want = evaluate(v, base)
  answered = 0
  # every way of cutting the dims into consecutive groups, each group merged (and also split into two where even)
  for cuts in itertools.product([False, True], repeat=nd - 1):
    groups, cur = [], [v.shape[0]]
    for s, cut in zip(v.shape[1:], cuts):
      if cut: groups.append(cur); cur = [s]
      else: cur.append(s)
    groups.append(cur)
    merged = tuple(int(np.prod(g)) for g in groups)
    for new in {merged, tuple(x for m in merged for x in ((2, m // 2) if m % 2 == 0 and m > 2 else (m,)))}:
      r = v.reshape(new)
      if r is None: continue
      answered += 1
      assert r.shape == new
      np.testing.assert_array_equal(evaluate(r, base), want.reshape(new), err_msg=f"{v} -> {new}")
  assert answered >= 1    # at least the identity


def _divisions(item) -> list:
  """The floor divisions and modulos of output positions in the load indices of a scheduled kernel's canonical form
  (a max-pool's window is one reduction split by //3 and %3 into its dims: that is its own reshape)."""
  from fusegrad.codegen.ir import Load, toposort
  from fusegrad.graph import symbolic as sym
  out = []
  for x in toposort([st.value for st in item.kernel.stores]):
    if isinstance(x, Load):
      out += [a for a, _ in sym.lin(x.idx).terms
              if not isinstance(a, sym.Var) and any(not v.name.startswith("r") for v in sym.variables(a))]
  return out


@pytest.mark.parametrize("case", ["maxpool", "window_copy", "flip_crop"])
def test_views_over_computed_maps_index_dim_by_dim(case):
  """A pad, window, crop or flip over a computed (not stored) map reads its source dim by dim (codegen/lower._aligned):
  no flat position divided back into the dims (a padded position can be negative outside the pad's guard, so no range
  rule removes those divisions), and the values are numpy's."""
  import fusegrad as fg
  import fusegrad.nn.functional as F
  from tests.unit.kernels import one_kernel, run
  rng = np.random.default_rng(0)
  a = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
  x = fg.Tensor(a, device="PYTHON").realize()
  h = x.relu() * 2                       # computed: the view below composes with no buffer's strides
  if case == "maxpool":
    out = F.max_pool2d(h, 3, 2, 1)
    hp = np.pad(np.maximum(a, 0) * 2, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.stack([np.stack([hp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max((2, 3)) for j in range(4)], -1)
                     for i in range(5)], -2)
  elif case == "window_copy":
    from fusegrad.nn.functional import _unfold
    out = _unfold(h.pad((1, 1, 1, 1)), (3, 3), (1, 1), (1, 1)).contiguous()
    hp = np.pad(np.maximum(a, 0) * 2, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.stack([np.stack([hp[:, :, i:i + 9, j:j + 8] for j in range(3)], -1) for i in range(3)], -2)
  else:
    out = h.flip(3)[:, :, 1:7, ::2].contiguous()
    want = (np.maximum(a, 0) * 2)[:, :, 1:7, ::-1][:, :, :, ::2]
  item = one_kernel(out)
  assert _divisions(item) == [], _divisions(item)
  got = run(item, [])
  np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-6, atol=1e-6)


def read(v: View, base: np.ndarray) -> np.ndarray:
  """evaluate() without the Python loop: every index at once."""
  idx = np.indices(v.shape)
  flat = v.offset + sum((i * st for i, st in zip(idx, v.strides)), np.zeros(v.shape, dtype=np.int64))
  ok = np.ones(v.shape, dtype=bool)
  for i, (lo, hi) in zip(idx, v.mask or ()): ok &= (i >= lo) & (i < hi)
  out = np.zeros(v.shape, dtype=base.dtype)
  out[ok] = base[flat[ok]]
  return out


def _movement(r, v: View, ref: np.ndarray):
  """One random movement op applied to the view and to numpy's array of the same values: (op, view, array); the
  view is None where reshape answers that strides cannot express it."""
  nd = len(v.shape)
  op = r.choice(["permute", "expand", "pad", "shrink", "flip", "stride", "reshape"])
  if op == "permute":
    order = list(range(nd))
    r.shuffle(order)
    return op, v.permute(tuple(order)), ref.transpose(order)
  if op == "expand":
    shape = tuple(r.randint(1, 3) if s == 1 else s for s in v.shape)
    return op, v.expand(shape), np.broadcast_to(ref, shape)
  if op == "pad":
    pads = [(r.randint(0, 2), r.randint(0, 2)) for _ in range(nd)]
    return op, v.pad(pads), np.pad(ref, pads)
  if op == "shrink":
    bounds = []
    for s in v.shape:
      lo = r.randint(0, s - 1)
      bounds.append((lo, r.randint(lo + 1, s)))
    return op, v.shrink(bounds), ref[tuple(slice(lo, hi) for lo, hi in bounds)]
  if op == "flip":
    axes = [d for d in range(nd) if r.random() < 0.5]
    return op, v.flip(axes), np.flip(ref, axes)
  if op == "stride":
    steps = [r.randint(1, 3) for _ in range(nd)]
    return op, v.stride(steps), ref[tuple(slice(None, None, k) for k in steps)]
  n = int(np.prod(v.shape))
  d = r.choice([d for d in range(1, n + 1) if n % d == 0])
  shape = (d, n // d) if r.random() < 0.6 else (n,)
  return op, v.reshape(shape), ref.reshape(shape)


@pytest.mark.parametrize("seed", range(16))
def test_movement_chains_match_numpy(seed):
  """Random chains of permute, expand, pad, shrink, flip, stride and reshape composed into one View read, at every
  index, what numpy's same chain over the values holds (padding reads 0; the values are 1.. so a 0 is padding
  only); and the symbolic index of View.index, evaluated at every index, gives the same positions and validity."""
  from fusegrad.graph import symbolic as sym
  r = random.Random(seed)
  for _ in range(12):
    shape = tuple(r.randint(1, 4) for _ in range(r.randint(1, 4)))
    base = np.arange(1, int(np.prod(shape)) + 1, dtype=np.int64)
    v, ref, ops = View.contiguous(shape), base.reshape(shape), []
    for _ in range(r.randint(2, 6)):
      op, nv, nref = _movement(r, v, ref)
      if nv is None: continue      # (a reshape strides cannot express: the graph nests a second view instead)
      v, ref = nv, nref
      ops.append(op)
      assert v.shape == ref.shape, ops
      np.testing.assert_array_equal(read(v, base), ref, err_msg=f"{ops} -> {v}")
    vs = [sym.Var(f"i{d}", 0, s - 1) for d, s in enumerate(v.shape)]
    flat, valid = v.index([sym.lin(x) for x in vs])
    idx = np.indices(v.shape)
    env = dict(zip(vs, idx))
    ok = np.broadcast_to(sym.evaluate_cond(valid, env), v.shape)
    np.testing.assert_array_equal(ok, ref != 0, err_msg=f"{ops} -> {v}")
    pos = np.broadcast_to(sym.evaluate(flat, env), v.shape)
    np.testing.assert_array_equal(base[pos[ok]], ref[ok], err_msg=f"{ops} -> {v}")


def test_inverse_movements_give_the_view_back():
  """A permute and its inverse, a flip twice, a zero pad, a full shrink, a stride of 1 and an expand to the same
  shape are the same View (equal records: the scheduler keys by them)."""
  v = View.contiguous((2, 3, 4)).pad([(1, 0), (0, 2), (0, 0)]).shrink([(0, 3), (1, 5), (1, 4)])
  order = (2, 0, 1)
  assert v.permute(order).permute(tuple(np.argsort(order).tolist())) == v
  assert v.flip([0, 2]).flip([0, 2]) == v and v.flip([0, 2]) != v
  assert v.pad([(0, 0)] * 3) == v and v.shrink([(0, s) for s in v.shape]) == v
  assert v.stride([1, 1, 1]) == v and v.expand(v.shape) == v


def test_canonical_records():
  """Size-1 dims have stride 0, a mask covering the whole shape is no mask, a pad then a shrink to inside the
  padding is an all-invalid mask (it reads nothing), and only a plain row-major view of offset 0 is contiguous;
  reshape keeps a contiguous view contiguous and answers None where strides cannot express the new shape."""
  from fusegrad.graph.view import contiguous_strides
  assert contiguous_strides((2, 1, 3)) == (3, 0, 1) and contiguous_strides(()) == ()
  v = View.contiguous((2, 3))
  assert v.is_contiguous and v.strides == (3, 1)
  assert not v.permute((1, 0)).is_contiguous and not v.shrink([(1, 2), (0, 3)]).is_contiguous
  assert v.pad([(1, 0), (0, 0)]).shrink([(1, 3), (0, 3)]) == v          # the padding cut off again: no mask left
  empty = View.contiguous((4,)).pad([(3, 0)]).shrink([(0, 2)])
  assert empty.mask == ((0, 0),) and (read(empty, np.arange(1, 5)) == 0).all()
  assert v.reshape((3, 2)) == View.contiguous((3, 2)) and v.reshape((6,)).is_contiguous
  assert v.permute((1, 0)).reshape((6,)) is None
  t = View.contiguous((2, 3, 4)).permute((2, 0, 1))   # the last dim moved first: the other two still merge
  assert t.reshape((4, 6)) is not None and t.reshape((8, 3)) is None and t.reshape((2, 12)) is None
  base = np.arange(1, 25)
  np.testing.assert_array_equal(read(t.reshape((4, 6)), base), base.reshape(2, 3, 4).transpose(2, 0, 1).reshape(4, 6))
