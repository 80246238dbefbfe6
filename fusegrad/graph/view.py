"""Views: how a node's elements are laid out over its source, without copying.

A View maps an index tuple in its own shape to a flat position in the contiguous layout of its
source (offset + sum of index*stride) and to a validity condition (the mask that padding leaves).
Movement ops compose into one View when they can; when a reshape cannot be expressed over the
current strides, the graph nests a new View over the old one instead of copying.
"""
from __future__ import annotations
from typing import NamedTuple
from functools import reduce
import operator
from fusegrad.graph import symbolic as sym


def prod(xs) -> int: return reduce(operator.mul, xs, 1)


def contiguous_strides(shape) -> tuple:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc if s != 1 else 0)
    acc *= s
  return tuple(reversed(out))


class View(NamedTuple):
  """A named tuple (built in a quarter of a frozen dataclass's time; a training step builds hundreds): its plain
  tuple (`tuple(v)`) holds ints only, so a node key holding it is no object the garbage collector tracks."""
  shape: tuple
  strides: tuple
  offset: int = 0
  mask: tuple | None = None   # per dim (lo, hi): valid iff lo <= i < hi

  @staticmethod
  def contiguous(shape) -> "View":
    return View(tuple(shape), contiguous_strides(shape), 0, None)

  @property
  def is_contiguous(self) -> bool:
    return self.offset == 0 and self.mask is None and self.strides == contiguous_strides(self.shape)

  def index(self, idxs) -> tuple[sym.Lin, sym.Cond]:
    """Flat source position and validity for an index tuple of symbolic expressions."""
    flat = sym.const(self.offset)
    for i, st in zip(idxs, self.strides):
      if st: flat = flat + sym.mul(i, st)
    valid = sym.TRUE
    if self.mask is not None:
      for i, (lo, hi), s in zip(idxs, self.mask, self.shape):
        if lo > 0 or hi < s: valid = valid & sym.Cond.range(i, lo, hi)
    return flat, valid

  # ---- movement ops; the caller has checked the arguments ----------------------------------------
  def _canonical(self, shape, strides, offset, mask) -> "View":
    strides = tuple(0 if s == 1 else st for s, st in zip(shape, strides))
    if mask is not None:
      if any(lo >= hi for lo, hi in mask): mask = tuple((0, 0) for _ in shape)
      elif all(lo == 0 and hi == s for (lo, hi), s in zip(mask, shape)): mask = None
      else: mask = tuple(mask)
    return View(tuple(shape), strides, offset, mask)

  def permute(self, order) -> "View":
    return self._canonical([self.shape[i] for i in order], [self.strides[i] for i in order], self.offset,
                           None if self.mask is None else [self.mask[i] for i in order])

  def expand(self, shape) -> "View":
    mask = None
    if self.mask is not None:
      mask = [m if s == n else ((0, n) if m[1] > m[0] else (0, 0)) for m, s, n in zip(self.mask, self.shape, shape)]
    return self._canonical(shape, [st if s == n else 0 for st, s, n in zip(self.strides, self.shape, shape)],
                           self.offset, mask)

  def shrink(self, bounds) -> "View":
    offset = self.offset + sum(lo * st for (lo, _), st in zip(bounds, self.strides))
    mask = None
    if self.mask is not None:
      mask = [(max(0, mlo - lo), max(0, min(hi, mhi) - lo)) for (mlo, mhi), (lo, hi) in zip(self.mask, bounds)]
    # a runtime size (graph/dims.BoundDim) as the end of a dim kept from 0 stays the dim's size
    return self._canonical([hi if lo == 0 else hi - lo for lo, hi in bounds], self.strides, offset, mask)

  def pad(self, pads) -> "View":
    """pads: per dim (before, after), both >= 0."""
    mask = self.mask or tuple((0, s) for s in self.shape)
    offset = self.offset - sum(b * st for (b, _), st in zip(pads, self.strides))
    shape = [s + b + a for s, (b, a) in zip(self.shape, pads)]
    mask = [(lo + b, hi + b) for (lo, hi), (b, _) in zip(mask, pads)]
    return self._canonical(shape, self.strides, offset, mask)

  def flip(self, axes) -> "View":
    strides, offset, mask = list(self.strides), self.offset, list(self.mask) if self.mask else None
    for a in axes:
      s = self.shape[a]
      if s <= 0: continue
      offset += (s - 1) * strides[a]
      strides[a] = -strides[a]
      if mask is not None: mask[a] = (s - mask[a][1], s - mask[a][0])
    return self._canonical(self.shape, strides, offset, mask)

  def stride(self, steps) -> "View":
    """Keep every step-th element along each dim (step >= 1), starting at 0."""
    shape = [(s + k - 1) // k for s, k in zip(self.shape, steps)]
    strides = [st * k for st, k in zip(self.strides, steps)]
    mask = None
    if self.mask is not None:
      mask = [((lo + k - 1) // k, (hi + k - 1) // k) for (lo, hi), k in zip(self.mask, steps)]
    return self._canonical(shape, strides, self.offset, mask)

  def reshape(self, shape) -> "View | None":
    """The same elements under a new shape, or None when these strides cannot express it."""
    shape = tuple(shape)
    if self.shape == shape: return self
    if prod(self.shape) == 0: return View.contiguous(shape)
    if self.is_contiguous: return View.contiguous(shape)
    # merge old dims into groups that are contiguous with each other, then split groups into new dims. A mask stays
    # expressible per dim when every masked dim keeps its size as one new dim; the dims it leaves whole merge and
    # split as an unmasked view's (a padded map's batch and channel dims into one: a window view over it then
    # indexes by strides, not by a flat position divided back into dims)
    masks = self.mask or tuple((0, n) for n in self.shape)
    if any(m != (0, 1) for n, m in zip(self.shape, masks) if n == 1): return None
    groups = []  # [size, innermost stride, mask (None: whole)]
    for n, st, m in zip(self.shape, self.strides, masks):
      if n == 1: continue
      whole = m == (0, n)
      if whole and groups and groups[-1][2] is None and groups[-1][1] == st * n:
        groups[-1] = [groups[-1][0] * n, st, None]
      else: groups.append([n, st, None if whole else m])
    strides, mask, gi = [], [], 0
    for n in shape:
      if n == 1: strides.append(0); mask.append((0, 1)); continue
      while gi < len(groups) and groups[gi][0] == 1: gi += 1
      if gi >= len(groups) or groups[gi][0] % n: return None
      g = groups[gi]
      if g[2] is not None:   # a masked dim: kept whole
        if g[0] != n: return None
        strides.append(g[1]); mask.append(g[2])
        g[0] = 1
        continue
      g[0] //= n
      strides.append(g[1] * g[0]); mask.append((0, n))
    return self._canonical(shape, strides, self.offset, mask if self.mask is not None else None)
