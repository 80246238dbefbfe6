"""graph/symbolic: index expressions simplify to what they compute (checked by evaluating them over every index)."""
from __future__ import annotations
import random
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


def _grid(*vs: sym.Var) -> dict:
  """Every value of each variable (broadcast against each other)."""
  out = {}
  for i, v in enumerate(vs):
    shape = [1] * len(vs)
    shape[i] = v.hi - v.lo + 1
    out[v] = np.arange(v.lo, v.hi + 1).reshape(shape)
  return out


def _values(e, env: dict) -> np.ndarray:
  shape = np.broadcast_shapes(*(np.shape(x) for x in env.values()))
  return np.broadcast_to(sym.evaluate(e, env), shape)


def test_sums_have_one_canonical_form():
  """Sums built in any order are the same object; equal and opposite terms cancel; multiplying distributes over the
  constant; an expression without variables is a constant."""
  a, b, c = sym.Var("a", 0, 9), sym.Var("b", 0, 9), sym.Var("c", -4, 4)
  assert a + b == b + a and (a + b) + c == a + (b + c) == c + (a + b)
  assert a * 3 + a * (-3) == sym.const(0) and a - a == sym.const(0)
  assert 2 * (a + 1) == a * 2 + 2 and (a + 1) * 2 - 2 == sym.lin(a) * 2
  assert sym.lin(a).terms == ((a, 1),) and sym.lin(7) == sym.const(7) and sym.lin(sym.lin(a)) == sym.lin(a)
  assert sym.as_const(a * 0 + 5) == 5 and sym.as_const(a + 0) is None
  assert sym.mul(a, sym.const(3)) == sym.mul(sym.const(3), a) == a * 3
  with pytest.raises(TypeError): sym.lin("a")
  with pytest.raises(TypeError): sym.mul(a, b)
  for bad in (0, -2):
    with pytest.raises(ValueError): sym.div(a, bad)
    with pytest.raises(ValueError): sym.mod(a, bad)


def test_division_and_modulo_use_the_ranges():
  """Each rule of div and mod, with its range analysis: what a range makes constant folds away, an exact multiple is
  split off, a common factor cancels, nested divisions and modulos merge; negative ranges floor as Python does."""
  a, b = sym.Var("a", 0, 7), sym.Var("b", 0, 5)
  y, n = sym.Var("y", 0, 10 ** 6), sym.Var("n", -8, -1)
  assert sym.div(a, 8) == sym.const(0) and sym.mod(a, 8) == sym.lin(a)            # a in [0, 8)
  assert sym.div(a + 8 * b, 8) == sym.lin(b) and sym.mod(a + 8 * b, 8) == sym.lin(a)
  assert sym.div(4 * b + 2, 4) == sym.lin(b) and sym.mod(4 * b + 2, 4) == sym.const(2)
  assert sym.mod(6 * a, 4) == sym.mod(a, 2) * 2                                  # gcd(6, 4) = 2 taken out
  assert sym.div(sym.div(y, 4), 5) == sym.div(y, 20)
  assert sym.mod(sym.mod(y, 20), 5) == sym.mod(y, 5) == sym.mod(sym.mod(y, 5), 20)
  assert sym.mod(sym.mod(y, 5), 3) != sym.mod(y, 3)                               # 3 does not divide 5: kept
  assert sym.div(n, 8) == sym.const(-1) and sym.mod(n, 8) == n + 8                # n in [-8, 0)
  assert sym.div(y, 1) == sym.lin(y) and sym.mod(y, 1) == sym.const(0)
  assert sym.add(sym.mod(y, 7), sym.mul(sym.div(y, 7), 7)) == sym.lin(y)          # a reshape's round trip


def test_bounds():
  """bounds() is the exact range of a sum of variables, and a sound one of divisions and modulos."""
  a, b, y = sym.Var("a", 0, 4), sym.Var("b", 0, 3), sym.Var("y", 0, 10 ** 6)
  assert sym.bounds(3 * a - 2 * b + 1) == (-5, 13)
  assert sym.bounds(sym.div(a - 8, 3)) == (-3, -2)
  assert sym.bounds(sym.mod(y, 7)) == (0, 6) and sym.bounds(sym.mod(a + 1, 7)) == (1, 5)
  assert sym.bounds(sym.const(-3)) == (-3, -3)


def _random_expr(r: random.Random, vs: list, env: dict, depth: int):
  """(expression, its values computed by Python's own integer arithmetic on the grid env)."""
  if depth == 0 or r.random() < 0.25:
    if r.random() < 0.75:
      v = r.choice(vs)
      return sym.lin(v), env[v]
    k = r.randint(-20, 20)
    return sym.const(k), k
  op = r.choice(["add", "sub", "mul", "div", "mod"])
  x, xv = _random_expr(r, vs, env, depth - 1)
  if op in ("add", "sub"):
    y, yv = _random_expr(r, vs, env, depth - 1)
    return (x + y, xv + yv) if op == "add" else (x - y, xv - yv)
  if op == "mul":
    k = r.randint(-9, 9)
    return x * k, xv * k
  c = r.choice([1, 2, 3, 4, 5, 7, 8, 12, 16, 30])
  return (sym.div(x, c), xv // c) if op == "div" else (sym.mod(x, c), xv % c)


def _trunc_div(x, c):
  return np.sign(x) * (np.abs(x) // c)


@pytest.mark.parametrize("seed", range(8))
def test_random_expressions_are_floor_arithmetic(seed):
  """Random sums, differences, products (negative coefficients too), floor divisions and modulos over variables
  whose ranges cross zero: at every point of the ranges the simplified expression's value is Python's floor
  arithmetic on the same numbers, bounds() contains every value, and the rendering a C renderer gets is right
  where it is told a numerator cannot be negative (C's / and % truncate: evaluated here with truncation there,
  floor elsewhere)."""
  r = random.Random(seed * 7919 + 1)
  for _ in range(40):
    vs = []
    for name in "abc":
      lo = r.randint(-6, 3)
      vs.append(sym.Var(name, lo, lo + r.randint(0, 11)))
    env = _grid(*vs)
    e, want = _random_expr(r, vs, env, r.randint(1, 5))
    got = _values(e, env)
    want = np.broadcast_to(want, got.shape)
    np.testing.assert_array_equal(got, want, err_msg=repr(e))
    lo, hi = sym.bounds(e)
    assert lo <= want.min() and want.max() <= hi, (e, lo, hi)
    text = sym.render(e, lambda v: v.name,
                      lambda x, c, neg: f"{'FD' if neg else 'TD'}({x},{c})",
                      lambda x, c, neg: f"{'FM' if neg else 'TM'}({x},{c})")
    ns = {v.name: env[v] for v in vs} | {"FD": lambda x, c: x // c, "FM": lambda x, c: x % c, "TD": _trunc_div,
                                          "TM": lambda x, c: x - c * _trunc_div(x, c)}
    np.testing.assert_array_equal(np.broadcast_to(eval(text, ns), got.shape), want, err_msg=text)


@pytest.mark.parametrize("seed", range(4))
def test_substitution_re_simplifies(seed):
  """substitute(e, {a: f}) evaluates as e evaluated at a = f, for random e and f whose range lies within a's; and
  it simplifies again on the way up: x // 8 with x replaced by a variable below 8 is 0, and a reshape's split
  (x % 8 + 8 (x // 8)) of x = a + 8 b is a + 8 b."""
  r = random.Random(seed)
  b, c = sym.Var("b", -3, 5), sym.Var("c", 0, 6)
  env = _grid(b, c)
  done = 0
  while done < 30:
    f, fv = _random_expr(r, [b, c], env, 2)
    lo, hi = sym.bounds(f)
    a = sym.Var("a", lo - r.randint(0, 2), hi + r.randint(0, 2))
    e, _ = _random_expr(r, [a, b, c], {a: np.zeros(1, int), b: np.zeros(1, int), c: np.zeros(1, int)}, 4)
    got = _values(sym.substitute(e, {a: f}), env)
    np.testing.assert_array_equal(got, np.broadcast_to(sym.evaluate(e, {**env, a: np.broadcast_to(fv, got.shape)}),
                                                       got.shape), err_msg=f"{e} at a = {f}")
    done += 1
  x, a7, b5 = sym.Var("x", 0, 63), sym.Var("a", 0, 7), sym.Var("b", 0, 5)
  assert sym.substitute(sym.div(x, 8), {x: sym.lin(a7)}) == sym.const(0)
  assert sym.substitute(sym.mod(x, 8) + sym.div(x, 8) * 8, {x: a7 + 8 * b5}) == a7 + 8 * b5


@pytest.mark.parametrize("shape", [(7,), (3, 1, 4), (2, 3, 5), (1, 1), (4, 1, 1, 6)])
def test_unravel_is_numpys(shape):
  """unravel(flat, shape) gives each dim's index of a row-major flat position, as np.unravel_index, at every
  position; a dim of size 1 is the constant 0."""
  p = sym.Var("p", 0, int(np.prod(shape)) - 1)
  idx = sym.unravel(sym.lin(p), shape)
  allp = np.arange(p.hi + 1)
  for got, want, n in zip(idx, np.unravel_index(allp, shape), shape):
    if n == 1: assert got == sym.const(0)
    np.testing.assert_array_equal(np.broadcast_to(sym.evaluate(got, {p: allp}), allp.shape), want)


def test_conditions():
  """Cond.range is TRUE where the bounds already hold, FALSE where they never can, else one part narrowed to what
  the expression can reach; & conjoins without duplicates and FALSE absorbs; evaluated and substituted conditions
  hold exactly where numpy's comparisons do."""
  a, b = sym.Var("a", 0, 7), sym.Var("b", 0, 5)
  assert sym.Cond.range(a, 0, 8).is_true and sym.Cond.range(a, -5, 100).is_true
  assert sym.Cond.range(a, 8, 10).false and sym.Cond.range(a, -3, 0).false and sym.Cond.range(a, 3, 3).false
  assert sym.Cond.range(a, 2, 20).parts == ((sym.lin(a), 2, 8),)
  c = sym.Cond.range(a - b, 0, 3)
  assert (c & c) == c and (c & sym.FALSE).false and (sym.TRUE & c) == c
  both = c & sym.Cond.range(a + b, 4, 9)
  env = _grid(a, b)
  av, bv = env[a], env[b]
  np.testing.assert_array_equal(sym.evaluate_cond(both, env), (av - bv >= 0) & (av - bv < 3) & (av + bv >= 4) &
                                (av + bv < 9))
  x = sym.Var("x", 0, 3)
  sub = both.substitute({a: x + 4})
  assert len(sub.parts) == 2 and all(sym.variables(e) == {x, b} for e, _, _ in sub.parts)
  envx = _grid(x, b)
  np.testing.assert_array_equal(sym.evaluate_cond(sub, envx),
                                sym.evaluate_cond(both, {a: envx[x] + 4, b: envx[b]}))
  assert sym.Cond.range(a, 4, 8).substitute({a: x + 4}).is_true          # x + 4 in [4, 7]: always
  assert sym.Cond.range(a, 4, 8).substitute({a: sym.lin(x)}).false        # x in [0, 3]: never


def test_simplify_under_its_condition():
  """A crop's gradient index ((p%58 + (p//58)*56) // 3136) is 0 wherever p%58 < 56 and p//58 < 56 (its only
  uses): simplify_under finds that; at every p where the condition holds the two agree."""
  p = sym.Var("p", 0, 58 * 58 - 1)
  x = sym.div(sym.add(sym.mod(p, 58), sym.mul(sym.div(p, 58), 56)), 3136)
  cond = sym.Cond.range(sym.mod(p, 58), 0, 56) & sym.Cond.range(sym.div(p, 58), 0, 56)
  assert x != sym.const(0) and sym.simplify_under(x, cond) == sym.const(0)
  allp = np.arange(58 * 58)
  holds = sym.evaluate_cond(cond, {p: allp})
  assert holds.sum() == 56 * 56 and (sym.evaluate(x, {p: allp})[holds] == 0).all()
  assert sym.evaluate(x, {p: allp}).max() == 1        # (where it does not hold the expression is not 0)
  assert sym.simplify_under(x, sym.TRUE) == x
