"""Symbolic integer index expressions, simplified as they are built.

Views turn into these: a kernel's loads and stores index buffers through expressions over its
loop variables. Every expression is kept in one canonical form — a constant plus a sum of
coefficient * atom, where an atom is a Var, a floor Div or a floor Mod by a positive constant —
and the constructors apply the div/mod rules with range analysis, so what reaches a renderer is
already simple. Renderers only need `render` and `evaluate`.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from math import gcd
from typing import Callable, Union


class Expr:
  """Base class; instances are immutable and compare structurally."""
  __slots__ = ()
  def __add__(self, o): return add(self, o)
  __radd__ = __add__
  def __sub__(self, o): return add(self, mul(o, -1))
  def __rsub__(self, o): return add(o, mul(self, -1))
  def __mul__(self, o): return mul(self, o)
  __rmul__ = __mul__
  def __floordiv__(self, o): return div(self, o)
  def __mod__(self, o): return mod(self, o)
  def __neg__(self): return mul(self, -1)


@dataclass(frozen=True, eq=True, repr=False)
class Var(Expr):
  name: str
  lo: int
  hi: int            # inclusive
  def __repr__(self): return self.name


@dataclass(frozen=True, eq=True, repr=False)
class ArgVar(Var):
  """A kernel argument used in an index (codegen/ir: the value of Kernel.params[slot], bound at each launch; a
  view's offset into a buffer), not a loop: one program serves every value within [lo, hi]."""
  slot: int = 0


@dataclass(frozen=True, eq=True, repr=False)
class Div(Expr):
  x: "Lin"
  c: int
  def __repr__(self): return f"({self.x!r}//{self.c})"


@dataclass(frozen=True, eq=True, repr=False)
class Mod(Expr):
  x: "Lin"
  c: int
  def __repr__(self): return f"({self.x!r}%{self.c})"


Atom = Union[Var, Div, Mod]


@dataclass(frozen=True, eq=True, repr=False)
class Lin(Expr):
  """const + sum(coef * atom); terms sorted by repr so equal sums are equal objects."""
  terms: tuple  # tuple[tuple[Atom, int], ...]
  const: int
  def __repr__(self):
    parts = [(f"{a!r}" if c == 1 else f"{a!r}*{c}") for a, c in self.terms]
    if self.const or not parts: parts.append(str(self.const))
    return "(" + "+".join(parts) + ")" if len(parts) > 1 else parts[0]


def const(v: int) -> Lin: return Lin((), int(v))


def lin(x) -> Lin:
  if isinstance(x, Lin): return x
  if isinstance(x, (Var, Div, Mod)): return Lin(((x, 1),), 0)
  if isinstance(x, int): return const(x)
  raise TypeError(f"not an index expression: {x!r}")


def as_const(x) -> int | None:
  x = lin(x)
  return x.const if not x.terms else None


def add(a, b) -> Lin:
  a, b = lin(a), lin(b)
  terms = dict(a.terms)
  for t, k in b.terms: terms[t] = terms.get(t, 0) + k
  return _make_with_const(terms, a.const + b.const)


def _make_with_const(terms: dict, c: int) -> Lin:
  """Canonical Lin from a term dict; folds k*c*(x//c) + k*(x%c) into k*x (a reshape's round trip)."""
  terms = {a: k for a, k in terms.items() if k != 0}
  changed = True
  while changed:
    changed = False
    for a, k in list(terms.items()):
      if isinstance(a, Mod):
        d = Div(a.x, a.c)
        if d not in terms:   # x//c may be in canonical form: (y//a)//c is y//(a*c)
          q = div(a.x, a.c)
          if len(q.terms) == 1 and q.const == 0 and q.terms[0][1] == 1: d = q.terms[0][0]
        x = a.x
        if terms.get(d) != k * a.c:
          # x//c beside y%c where x - y is a multiple of c (mod folded y's coefficients: (782g + r) % 200 is
          # (182g + r) % 200): y%c == x%c, so the pair is k*x too (a split sum's rows of 782 over rows of 200: a
          # division and a modulo per element, 12 ns each, where the index is the flat position)
          d = next((t for t, kt in terms.items() if isinstance(t, Div) and t.c == a.c and kt == k * a.c and
                    _multiple_of(add(t.x, mul(a.x, -1)), a.c)), None)
          if d is None: continue
          x = d.x
        if terms.get(d) == k * a.c:
          del terms[a], terms[d]
          for b, kb in x.terms: terms[b] = terms.get(b, 0) + kb * k
          c += x.const * k
          terms = {t: v for t, v in terms.items() if v != 0}
          changed = True
          break
  items = tuple(sorted(terms.items(), key=lambda t: repr(t[0])))
  return Lin(items, c)


def _multiple_of(x: Lin, c: int) -> bool:
  return x.const % c == 0 and all(k % c == 0 for _, k in x.terms)


def mul(a, k) -> Lin:
  if not isinstance(k, int):
    kc = as_const(k)
    if kc is None:
      ac = as_const(a)
      if ac is None: raise TypeError("index expressions multiply only by constants")
      a, k = k, ac
    else: k = kc
  a = lin(a)
  if k == 0: return const(0)
  return Lin(tuple((t, c * k) for t, c in a.terms), a.const * k)


def bounds(x) -> tuple[int, int]:
  x = lin(x)
  lo = hi = x.const
  for a, k in x.terms:
    alo, ahi = _atom_bounds(a)
    if k > 0: lo, hi = lo + k * alo, hi + k * ahi
    else: lo, hi = lo + k * ahi, hi + k * alo
  return lo, hi


def _atom_bounds(a) -> tuple[int, int]:
  if isinstance(a, Var): return a.lo, a.hi
  lo, hi = bounds(a.x)
  if isinstance(a, Div): return lo // a.c, hi // a.c
  if lo >= 0 and hi < a.c: return lo, hi
  if hi - lo + 1 >= a.c or lo // a.c != hi // a.c: return 0, a.c - 1
  return lo % a.c, hi % a.c


def div(x, c: int) -> Lin:
  """Floor division by a positive constant."""
  if not isinstance(c, int): c = as_const(c)
  if c is None or c <= 0: raise ValueError("index division needs a positive constant")
  x = lin(x)
  if c == 1: return x
  # split off the part that divides exactly
  q_terms, r_terms = {}, {}
  for a, k in x.terms:
    (q_terms if k % c == 0 else r_terms)[a] = k
  qc, rc = divmod(x.const, c)
  q = Lin(tuple((a, k // c) for a, k in q_terms.items()), qc)
  r = _make_with_const(r_terms, rc)
  lo, hi = bounds(r)
  if lo // c == hi // c: return add(q, lo // c)
  # common factor of the remainder and the divisor
  g = c
  for _, k in r.terms: g = gcd(g, k)
  if r.const % g == 0 and g > 1:
    r = Lin(tuple((a, k // g) for a, k in r.terms), r.const // g)
    c //= g
    lo, hi = bounds(r)
    if lo // c == hi // c: return add(q, lo // c)
  # (k*y + s)//c == y//(c/k) when k divides c and 0 <= s < k
  k_y = _split_small(r, c)
  if k_y is not None:
    k, y, _ = k_y
    return add(q, div(y, c // k))
  # nested division: (y//a)//c == y//(a*c)
  if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0], Div):
    inner = r.terms[0][0]
    return add(q, div(inner.x, inner.c * c))
  return add(q, Lin(((Div(r, c), 1),), 0))


def _split_small(r: Lin, c: int):
  """r == k*y + s with k > 1 dividing c and 0 <= s < k: returns (k, y, s), else None."""
  for k in sorted({gcd(abs(coef), c) for _, coef in r.terms} - {1}, reverse=True):
    big = {a: coef // k for a, coef in r.terms if coef % k == 0}
    small = _make_with_const({a: coef for a, coef in r.terms if coef % k}, r.const)
    if not big: continue
    lo, hi = bounds(small)
    if lo >= 0 and hi < k: return k, _make_with_const(big, 0), small
  return None


def mod(x, c: int) -> Lin:
  """Floor modulo by a positive constant."""
  if not isinstance(c, int): c = as_const(c)
  if c is None or c <= 0: raise ValueError("index modulo needs a positive constant")
  x = lin(x)
  if c == 1: return const(0)
  terms = {}
  for a, k in x.terms:
    k %= c
    if k: terms[a] = k
  r = _make_with_const(terms, x.const % c)
  lo, hi = bounds(r)
  if lo // c == hi // c: return add(r, -(lo // c) * c)
  g = c
  for _, k in r.terms: g = gcd(g, k)
  if g > 1 and r.const % g == 0:  # (g*y) % (g*m) == g * (y % m)
    return mul(mod(Lin(tuple((a, k // g) for a, k in r.terms), r.const // g), c // g), g)
  # (k*y + s) % c == k*(y % (c/k)) + s when k divides c and 0 <= s < k
  k_y = _split_small(r, c)
  if k_y is not None:
    k, y, small = k_y
    return add(mul(mod(y, c // k), k), small)
  # (y % b) % c == y % c when c divides b
  if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0], Mod):
    inner = r.terms[0][0]
    if inner.c % c == 0: return mod(inner.x, c)
  return Lin(((Mod(r, c), 1),), 0)


def variables(x) -> set:
  out = set()
  def walk(e):
    if isinstance(e, Var): out.add(e)
    elif isinstance(e, Lin):
      for a, _ in e.terms: walk(a)
    elif isinstance(e, (Div, Mod)): walk(e.x)
  walk(x if not isinstance(x, int) else const(x))
  return out


def substitute(x, env: dict) -> Lin:
  """Replace Vars by expressions, re-simplifying on the way up."""
  def sub(e):
    if isinstance(e, Var): return lin(env.get(e, e))
    if isinstance(e, Div): return div(sub(e.x), e.c)
    if isinstance(e, Mod): return mod(sub(e.x), e.c)
    out = const(e.const)
    for a, k in e.terms: out = add(out, mul(sub(a), k))
    return out
  return sub(lin(x))


# ---- validity conditions: a conjunction of lo <= expr < hi --------------------------------------

@dataclass(frozen=True, eq=True)
class Cond:
  """lo <= x < hi, conjoined over `parts`; an empty conjunction is True; `false` short-circuits."""
  parts: tuple = ()
  false: bool = False

  @staticmethod
  def range(x, lo: int, hi: int) -> "Cond":
    x = lin(x)
    blo, bhi = bounds(x)
    if blo >= lo and bhi < hi: return TRUE
    if bhi < lo or blo >= hi or lo >= hi: return FALSE
    return Cond(((x, max(lo, blo), min(hi, bhi + 1)),))

  def __and__(self, o: "Cond") -> "Cond":
    if self.false or o.false: return FALSE
    parts = list(self.parts)
    for p in o.parts:
      if p not in parts: parts.append(p)
    return Cond(tuple(parts))

  @property
  def is_true(self) -> bool: return not self.false and not self.parts

  def substitute(self, env: dict) -> "Cond":
    out = FALSE if self.false else TRUE
    for x, lo, hi in self.parts: out = out & Cond.range(substitute(x, env), lo, hi)
    return out

  def variables(self) -> set:
    out = set()
    for x, _, _ in self.parts: out |= variables(x)
    return out


TRUE = Cond()
FALSE = Cond((), True)


def unravel(flat, shape) -> tuple:
  """The index along each dim of `shape` (row-major, the first outermost) of flat position `flat`."""
  out, stride = [], 1
  for s in reversed(shape):
    out.append(stride)
    stride *= s
  strides = out[::-1]
  return tuple(const(0) if s == 1 else div(flat, st) if d == 0 else mod(div(flat, st), s)
               for d, (s, st) in enumerate(zip(shape, strides)))


def simplify_under(x, cond: Cond) -> Lin:
  """x simplified for where cond holds (a padded load's index, used only where its validity does): each part of
  cond that bounds a single atom (lo <= atom + c < hi) narrows that atom's range, x is rebuilt with the narrowed
  atoms (the div/mod rules see the tighter ranges) and the atoms put back. A crop's gradient read
  `((p%58 + (p/58)*56)/3136)` where p%58 < 56 and p/58 < 56 make it 0."""
  x = lin(x)
  if cond.false or not cond.parts: return x
  env: dict = {}
  for e, lo, hi in cond.parts:
    if len(e.terms) != 1 or e.terms[0][1] != 1: continue
    a = e.terms[0][0]
    alo, ahi = _atom_bounds(a)
    nlo, nhi = max(lo - e.const, alo), min(hi - 1 - e.const, ahi)
    if (nlo, nhi) == (alo, ahi) or nlo > nhi or a in env: continue
    env[a] = Var(f"_narrowed{len(env)}", nlo, nhi)
  if not env: return x
  def rebuild(e):
    if e in env: return lin(env[e])
    if isinstance(e, Var): return lin(e)
    if isinstance(e, Div): return div(rebuild(e.x), e.c)
    if isinstance(e, Mod): return mod(rebuild(e.x), e.c)
    out = const(e.const)
    for t, k in e.terms: out = add(out, mul(rebuild(t), k))
    return out
  return substitute(rebuild(x), {v: a for a, v in env.items()})


# ---- rendering and evaluation ---------------------------------------------------------------------

def render(x, name: Callable[[Var], str], floordiv: Callable[[str, int, bool], str],
           floormod: Callable[[str, int, bool], str]) -> str:
  """Infix rendering for C-like languages; the callbacks spell division and modulo, told whether the
  numerator can be negative (C truncates, we floor)."""
  def r(e) -> str:
    if isinstance(e, Var): return name(e)
    if isinstance(e, Div): return floordiv(r(e.x), e.c, bounds(e.x)[0] < 0)
    if isinstance(e, Mod): return floormod(r(e.x), e.c, bounds(e.x)[0] < 0)
    parts = []
    for a, k in e.terms:
      s = r(a)
      parts.append(s if k == 1 else f"{s}*{k}" if k > 0 else f"{s}*({k})")
    if e.const or not parts: parts.append(str(e.const) if e.const >= 0 else f"({e.const})")
    return parts[0] if len(parts) == 1 else "(" + "+".join(parts) + ")"
  return r(lin(x))


def render_cond(c: Cond, rx: Callable) -> str:
  if c.false: return "0"
  if not c.parts: return "1"
  out = []
  for x, lo, hi in c.parts:
    s = rx(x)
    blo, bhi = bounds(x)
    if lo > blo: out.append(f"({s}>={lo})")
    if hi <= bhi: out.append(f"({s}<{hi})")
  return "(" + "&&".join(out) + ")" if out else "1"


def evaluate(x, env: dict):
  """Evaluate with numpy arrays or ints bound to each Var (floor semantics, like Python)."""
  def ev(e):
    if isinstance(e, Var): return env[e]
    if isinstance(e, Div): return ev(e.x) // e.c
    if isinstance(e, Mod): return ev(e.x) % e.c
    out = e.const
    for a, k in e.terms: out = out + ev(a) * k
    return out
  return ev(lin(x))


def evaluate_cond(c: Cond, env: dict):
  if c.false: return False
  out = True
  for x, lo, hi in c.parts:
    v = evaluate(x, env)
    out = out & (v >= lo) & (v < hi)
  return out
