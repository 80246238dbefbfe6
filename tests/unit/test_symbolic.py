"""graph/symbolic: index expressions simplify to what they compute (checked by evaluating them over every index)."""
from __future__ import annotations
import numpy as np
import pytest
from fusegrad.graph import symbolic as sym


def test_a_split_sums_rows_fold_back_to_the_flat_position():
  """A [2000, 200] buffer summed as 512 parts of 782: its index (p % 200) + (p // 200) * 200, p = 782 g + r, whose
  modulo had its coefficient folded to (182 g + r) % 200, is p again (it was a division and a modulo per element)."""
  g, r = sym.Var("g", 0, 511), sym.Var("r", 0, 781)
  p = sym.add(sym.mul(g, 782), r)
  assert sym.add(sym.mod(p, 200), sym.mul(sym.div(p, 200), 200)) == p
  # the nested form: (y // 4) % 5 + 5 * (y // 20) is y // 4
  y = sym.Var("y", 0, 10 ** 6)
  assert sym.add(sym.mod(sym.div(y, 4), 5), sym.mul(sym.div(y, 20), 5)) == sym.div(y, 4)


@pytest.mark.parametrize("seed", range(20))
def test_modulo_and_division_pairs_evaluate_as_written(seed):
  """k * (x % c) + k * c * (x' // c) with x' - x a multiple of c folds to k * x'; otherwise it stays, and either way the
  expression's values are the arithmetic's."""
  rng = np.random.default_rng(seed)
  a, b = sym.Var("a", 0, 37), sym.Var("b", 0, 23)
  c = int(rng.integers(2, 40))
  ka, kb, k0 = (int(v) for v in rng.integers(-60, 200, 3))
  shift = [int(v) for v in rng.integers(-3, 4, 3)] if rng.random() < 0.7 else [int(v) for v in rng.integers(-50, 50, 3)]
  k = int(rng.choice([1, 2, -3]))
  x = sym.add(sym.add(sym.mul(a, ka), sym.mul(b, kb)), k0)
  x2 = sym.add(sym.add(sym.mul(a, ka + c * shift[0]), sym.mul(b, kb + c * shift[1])), k0 + c * shift[2])
  e = sym.add(sym.mul(sym.mod(x, c), k), sym.mul(sym.div(x2, c), k * c))
  av, bv = np.meshgrid(np.arange(38), np.arange(24), indexing="ij")
  xv = ka * av + kb * bv + k0
  x2v = xv + c * (shift[0] * av + shift[1] * bv + shift[2])
  np.testing.assert_array_equal(np.broadcast_to(sym.evaluate(e, {a: av, b: bv}), av.shape),
                                k * (xv % c) + k * c * (x2v // c))
  folded = not any(isinstance(t, (sym.Mod, sym.Div)) for t, _ in sym.lin(e).terms)
  # (where mod's own rules rewrote x % c first, a common factor taken out or a small part split off, the pair is no
  # longer of one x and may stay: still right, as checked above)
  if np.gcd.reduce([ka, kb, c]) == 1 and not (ka % c == 0 or kb % c == 0): assert folded, e
