"""graph/view.View: movement ops against numpy, element by element (no compiler, no device)."""
from __future__ import annotations
import itertools
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
