"""Optimizations as data: an Opt names an action, the axis it acts on (an index into Kernel.axes when it is
applied) and an amount. apply_opt is a pure function from Kernel to Kernel that checks legality first and
raises OptError saying why an action does not apply; the heuristics and the search choose among the same
actions, and Kernel.opts records the ones applied.

Every action keeps the kernel's meaning: it splits an axis (v = outer * n + inner), re-kinds it, reorders
axes or pads one; a result can change only by float reassociation (an UPCAST of a reduction axis keeps
several accumulators and folds them at the end), and under TC by the tensor core's rounding of its multiplicands
(none for 16-bit floats, which it multiplies exactly; tf32 keeps 10 bits of a float32's mantissa).
"""
from __future__ import annotations
import enum
from dataclasses import dataclass, replace
from fusegrad.graph import symbolic as sym
from fusegrad.codegen.ir import (Kernel, Axis, AxisKind, Reduce, Load, Alu, Store, SHARED_KINDS, substitute_kernel,
                                 substitute, toposort, dependencies, guard, axis_variables)
from fusegrad.codegen.opt import tc as tcs
from fusegrad.codegen.renderer.base import Caps

K = AxisKind


class OptOp(enum.Enum):
  UPCAST = "upcast"    # split off `arg` indices of an output or reduction axis, expanded in registers
  UNROLL = "unroll"    # split off `arg` indices of a reduction axis, unrolled in order into one accumulator
  LOCAL = "local"      # split off `arg` indices of a GLOBAL axis as a work-group dimension (of a LOOP axis: the
                       # loop shared by the work-group, GROUP_LOOP)
  GROUP = "group"      # split off `arg` indices of a reduction axis, reduced by a work-group in local memory
  SWAP = "swap"        # exchange the axis with axis `arg` (same kind): loop order, or which index runs fastest
  PADTO = "padto"      # round the axis's size up to a multiple of `arg`; the extra indices compute nothing
  LOOP = "loop"        # split off `arg` indices of a GLOBAL axis as a sequential loop inside each work item
  STAGE = "stage"      # split off `arg` indices of a reduction axis as a tile the work-group copies to local memory
  TC = "tc"            # the kernel's matmul on tensor core caps.tensor_cores[arg] (codegen/opt/tc.py), `axis` its
                       # reduction axis K: one warp per tile (_tc)
  PREFETCH = "prefetch"  # the STAGE axis's next tile loaded into registers while each step computes, then stored
                         # into local memory: one buffer (arg 1) or two taken in turn (arg 2) (_prefetch)
  PIECES = "pieces"    # cut a global or loop axis into `arg` consecutive pieces, the kernel's body copied once per
                       # piece (an UNROLL axis outside the rest: v = piece * size/arg + inner): where conditions cut
                       # the axis at the pieces' bounds (a concatenation), each copy keeps only its piece's terms
  READAHEAD = "readahead"  # the loads that step at least a cache line per iteration of the reduction loop `axis`
                           # asked for `arg` bytes ahead of their use (software prefetch: _read_ahead)
  PEEL = "peel"        # cut a reduction axis into its whole multiples of `arg` and the tail after them: each
                       # reduction over it becomes the fold of two, the tail's a new reduction axis after it (_peel)


@dataclass(frozen=True)
class Opt:
  op: OptOp
  axis: int
  arg: int
  def __repr__(self): return f"Opt({self.op.name}, {self.axis}, {self.arg})"


class OptError(ValueError):
  """An action that does not apply to this kernel on this device; the message says why."""


def apply_opts(k: Kernel, opts, caps: Caps) -> Kernel:
  for o in opts: k = apply_opt(k, o, caps)
  return k


def apply_opt(k: Kernel, opt: Opt, caps: Caps) -> Kernel:
  if not isinstance(opt, Opt): raise OptError(f"not an Opt: {opt!r}")
  if not 0 <= opt.axis < len(k.axes):
    raise OptError(f"{opt}: the kernel {k.name} has {len(k.axes)} axes {list(k.axes)}")
  a = k.axes[opt.axis]
  fn = _APPLY[opt.op]
  out = fn(k, opt, a, caps)
  return replace(out, opts=k.opts + (opt,))


def _need(ok: bool, opt: Opt, k: Kernel, why: str) -> None:
  if not ok: raise OptError(f"{opt} on {k.name} {list(k.axes)}: {why}")


def _register_count(k: Kernel) -> int:
  """Values one work item holds expanded at once: the most of its register tile of outputs, and of each reduction's
  accumulators (or unrolled values) times the part of the tile it is computed for (a matmul's: all of it; a
  softmax's max: none of its outputs' lanes)."""
  reds = _reduces(k)
  inside = {v for r in reds for v in r.loops}
  size = {a.var: a.size for a in k.axes if a.kind is K.UPCAST or (a.kind is K.UNROLL and a.var in inside)}
  # (an UNROLL output axis, PIECES: each copy's values are made and stored before the next copy's, not held together)
  tile = [v for v in size if v not in inside]
  out = 1
  for v in tile: out *= size[v]
  deps = dependencies([st.value for st in k.stores]) if reds else {}
  per = [out]
  for r in reds:
    n = 1
    for v in r.loops: n *= size.get(v, 1)
    for v in tile:
      if v in deps[id(r)]: n *= size[v]
    per.append(n)
  return max(per)


def _split(k: Kernel, i: int, n: int, inner_kind: AxisKind, outer_kind: AxisKind | None = None,
           names: str = "oi") -> Kernel:
  """Axis i (size s) becomes outer (s // n, outer_kind: its own by default) and inner (n, inner_kind) right after it:
  v = outer*n + inner, the new variables named v's name and `names`. With n == s the axis is re-kinded in place."""
  a = k.axes[i]
  if n == a.size: return replace(k, axes=k.axes[:i] + (Axis(a.var, inner_kind, a.end),) + k.axes[i + 1:])
  v = a.var
  taken = {x.var.name for x in k.axes}
  name = v.name
  while name + names[0] in taken or name + names[1] in taken: name += "_"
  vo, vi = sym.Var(name + names[0], 0, a.size // n - 1), sym.Var(name + names[1], 0, n - 1)
  # a runtime end (ir.Axis.end) bounds the outer part: the blocks that hold an index below it (the inner part stays
  # whole; the guards on the axis's variable keep the indices past the end computing nothing)
  end = None if a.end is None else sym.div(a.end + (n - 1), n)
  axes = k.axes[:i] + (Axis(vo, outer_kind or a.kind, end), Axis(vi, inner_kind)) + k.axes[i + 1:]
  return substitute_kernel(k, {v: sym.lin(vo) * n + vi}, {v: (vo, vi)}, axes)


def _pieces(k, opt, a, caps):
  """Axis a (size s) becomes pieces (arg, UNROLL: expanded, one copy of the body per piece) and inner (s // arg, a's
  kind) after it: v = piece * (s // arg) + inner. In each copy the piece is a constant, so a condition that bounds v at
  multiples of s // arg (a concatenation's parts: `200 <= v < 400`) is decided: the copy reads its own part without a
  condition and computes no other part's terms."""
  _need(a.kind in (K.GLOBAL, K.LOOP), opt, k, f"only a global or loop axis is cut into pieces, this one is {a.kind.value}")
  _need(a.end is None, opt, k, f"the axis {a} has a size known at run time only")
  _check_split(k, opt, a)
  if opt.arg == a.size: return replace(k, axes=k.axes[:opt.axis] + (Axis(a.var, K.UNROLL),) + k.axes[opt.axis + 1:])
  return _split(k, opt.axis, a.size // opt.arg, a.kind, K.UNROLL, "ci")


def _check_split(k: Kernel, opt: Opt, a: Axis) -> None:
  _need(opt.arg > 1, opt, k, f"the amount must be > 1, got {opt.arg}")
  _need(a.size % opt.arg == 0, opt, k, f"{opt.arg} does not divide the axis size {a.size} (PADTO first)")


def _upcast(k, opt, a, caps):
  _need(a.kind in (K.GLOBAL, K.LOOP, K.REDUCE), opt, k, f"cannot upcast a {a.kind.value} axis")
  _check_split(k, opt, a)
  return _registers_ok(_split(k, opt.axis, opt.arg, K.UPCAST), opt, caps)


def _unroll(k, opt, a, caps):
  _need(a.kind is K.REDUCE, opt, k, f"only a reduction axis unrolls, this one is {a.kind.value}")
  _check_split(k, opt, a)
  return _registers_ok(_split(k, opt.axis, opt.arg, K.UNROLL), opt, caps)


def _registers_ok(k: Kernel, opt: Opt, caps: Caps) -> Kernel:
  n = _register_count(k)
  _need(n <= caps.max_registers, opt, k, f"{n} values in registers exceed the device's {caps.max_registers}")
  return k


def _local(k, opt, a, caps):
  _need(caps.has_local, opt, k, "the device has no work-groups")
  _need(a.kind in (K.GLOBAL, K.LOOP), opt, k, f"only a global or loop axis becomes local, this one is {a.kind.value}")
  _check_split(k, opt, a)
  if a.kind is K.LOOP:   # the loop shared by the work-group: each item takes every arg-th index
    _no_warp(k, opt)
    _shared_ok(k, opt, caps)
    grouped = [r for r in _reduces(k) if any(x.kind is K.GROUP_REDUCE and x.var in r.loops for x in k.axes)]
    deps = dependencies([st.value for st in k.stores])
    _need(not any(a.var in deps[id(r)] for r in grouped), opt, k,
          "a grouped reduction depends on the loop: its work items would reduce different rows")
    return _split(k, opt.axis, opt.arg, K.GROUP_LOOP)
  size = _local_items(k) * max(k.shared_size, 1) * opt.arg
  _need(size <= caps.max_local, opt, k, f"a work-group of {size} exceeds the device's {caps.max_local}")
  return _split(k, opt.axis, opt.arg, K.LOCAL)


def _local_items(k: Kernel) -> int:
  n = 1
  for x in k.of_kind(K.LOCAL, K.WARP): n *= x.size
  return n


def _no_warp(k: Kernel, opt: Opt) -> None:
  """A tensor core's work-group is its warps, each lane the fragments' owner: no shared axis, no local tiles (the
  fragments are read by each lane; staging them is not done yet)."""
  _need(not k.of_kind(K.WARP), opt, k, "the kernel computes on tensor cores (TC): its work-group is made of warps")


def _shared_ok(k: Kernel, opt: Opt, caps: Caps) -> None:
  """A GROUP or a LOCAL of a loop adds to the work-group's shared axis: one size for all of them."""
  g = k.shared_size
  _need(g in (0, opt.arg), opt, k, f"the work-group's shared axis has {g} items: every grouped axis has that size")
  size = _local_items(k) * opt.arg
  _need(size <= caps.max_local, opt, k, f"a work-group of {size} exceeds the device's {caps.max_local}")


def _loop(k, opt, a, caps):
  _need(a.kind is K.GLOBAL, opt, k, f"only a global axis becomes a loop, this one is {a.kind.value}")
  _check_split(k, opt, a)
  return _split(k, opt.axis, opt.arg, K.LOOP)


def _stage(k, opt, a, caps):
  from fusegrad.codegen import passes
  _need(caps.has_local, opt, k, "the device has no work-groups (local memory)")
  _need(a.kind is K.REDUCE, opt, k, f"only a reduction axis is staged, this one is {a.kind.value}")
  _no_warp(k, opt)
  _need(bool(k.of_kind(K.LOCAL)), opt, k, "no work-group axes: no items to share a copy")
  _need(not k.of_kind(K.STAGE), opt, k, "one staged axis per kernel")
  _check_split(k, opt, a)
  out = _split(k, opt.axis, opt.arg, K.STAGE)
  tiles = passes.stages(passes.stage(out))
  _need(bool(tiles), opt, k, "no load of the reduction reads a tile shared by the work-group")
  nbytes = sum(t.length * t.dtype.itemsize for t in tiles)
  _need(nbytes <= caps.local_bytes, opt, k, f"the tiles' {nbytes} bytes exceed the device's {caps.local_bytes}")
  return out


def _prefetch(k, opt, a, caps):
  """Software pipelining of a staged reduction (ir.Stage.prefetch): each step of the loop over the tiles loads the
  next tile's values into registers before it reads its own tile from local memory, and stores them after; `arg`
  local buffers per tile (2: no barrier between the step's reads and the next tile's stores)."""
  from fusegrad.codegen import passes
  _need(caps.has_local, opt, k, "the device has no work-groups (local memory)")
  _need(a.kind is K.STAGE, opt, k, f"only the staged axis (STAGE first) is prefetched, this one is {a.kind.value}")
  _need(not k.prefetch, opt, k, "the staged tiles are prefetched already")
  _need(opt.arg in (1, 2), opt, k, f"the tiles take 1 or 2 local buffers, not {opt.arg}")
  out = replace(k, prefetch=opt.arg)
  tiles = passes.stages(passes.stage(out))
  _need(any(t.prefetch is not None for t in tiles), opt, k,
        "no tile has a next one: the reduction has no loop outside the staged axis (one tile), or the tiles do not "
        "change along it")
  nbytes = sum(t.length * t.dtype.itemsize for t in tiles)
  _need(nbytes <= caps.local_bytes, opt, k, f"the tiles' {nbytes} bytes exceed the device's {caps.local_bytes}")
  # every item holds its share of each prefetched tile (its copy steps) besides its register tile
  held = sum(-(-t.size // k.local_size[0]) for t in tiles if t.prefetch is not None)
  n = _register_count(k) + held
  _need(n <= caps.max_registers, opt, k, f"{n} values in registers (the prefetched tiles' {held} with the rest) "
        f"exceed the device's {caps.max_registers}")
  return out


def _read_ahead(k, opt, a, caps):
  """Software prefetch along a reduction loop (codegen/passes.read_ahead): every unconditional load that steps at
  least a cache line per iteration of the loop (a matmul's panel of columns: one vector a step) is asked for `arg`
  bytes ahead of the step that reads it, so the line is on its way from L2 or L3 before the loop gets there. Loads
  that step less (a row of scalars) are left to the hardware's prefetcher, which follows them well. A hint: the
  values are the same with or without it."""
  from fusegrad.codegen import passes
  LINE_BYTES = passes.LINE_BYTES
  _need(a.kind is K.REDUCE, opt, k, f"only a reduction loop reads ahead, this axis is {a.kind.value}")
  _need(opt.arg % LINE_BYTES == 0 and LINE_BYTES <= opt.arg <= 4096, opt, k,
        f"the distance is a multiple of {LINE_BYTES} bytes (a cache line) up to 4096 (a page), got {opt.arg}")
  _need(all(v != a.var for v, _ in k.read_ahead), opt, k, "the loop reads ahead already")
  loads = passes.streamed_loads([st.value for st in k.stores], a.var)
  _need(bool(loads), opt, k, f"no load steps a cache line ({LINE_BYTES} bytes) per iteration of the loop")
  return replace(k, read_ahead=k.read_ahead + ((a.var, opt.arg),))


def _group(k, opt, a, caps):
  _need(caps.has_local, opt, k, "the device has no work-groups (local memory)")
  _need(a.kind is K.REDUCE, opt, k, f"only a reduction axis is grouped, this one is {a.kind.value}")
  _no_warp(k, opt)
  _check_split(k, opt, a)
  reds = _reduces(k)
  owners = [r for r in reds if a.var in r.loops]
  _need(len(owners) == 1, opt, k, "the axis must belong to exactly one reduction")
  grouped = {x.var for x in k.of_kind(K.GROUP_REDUCE)}
  _need(not grouped & set(owners[0].loops), opt, k, "the reduction has a grouped axis already")
  # the partial results of a work-group meet in local memory: every item of the group must reduce the same values
  # (a reduction that depends on a loop the group shares would mix rows)
  deps = dependencies([st.value for st in k.stores])
  _need(not deps[id(owners[0])] & {x.var for x in k.of_kind(*SHARED_KINDS)}, opt, k,
        "the reduction depends on an axis the work-group shares")
  _need(not any(a.var in deps[id(r)] for r in reds if grouped & set(r.loops)), opt, k,
        "a grouped reduction depends on the axis: its work items would reduce different values")
  _shared_ok(k, opt, caps)
  nbytes = sum(r.dtype.itemsize for r in reds if grouped & set(r.loops)) + owners[0].dtype.itemsize
  _need(_local_items(k) * opt.arg * nbytes <= caps.local_bytes, opt, k, "the partial results exceed local memory")
  return _split(k, opt.axis, opt.arg, K.GROUP_REDUCE)


def _swap(k, opt, a, caps):
  _need(0 <= opt.arg < len(k.axes) and opt.arg != opt.axis, opt, k, f"no other axis {opt.arg} to swap with")
  b = k.axes[opt.arg]
  _need(a.kind is b.kind and a.kind in (K.GLOBAL, K.LOOP, K.LOCAL, K.REDUCE), opt, k,
        f"swaps two axes of one kind (global, local, loop or reduce), got {a.kind.value} and {b.kind.value}")
  axes = list(k.axes)
  axes[opt.axis], axes[opt.arg] = b, a
  if a.kind is not K.REDUCE: return replace(k, axes=tuple(axes))
  owners = [r for r in _reduces(k) if a.var in r.loops or b.var in r.loops]
  _need(all(a.var in r.loops and b.var in r.loops for r in owners), opt, k, "the axes belong to different reductions")
  swap = {a.var: (b.var,), b.var: (a.var,)}
  # exchanging two loop variables in every reduction's loop list exchanges their nesting
  return substitute_kernel(k, {}, swap, tuple(axes))


def _padto(k, opt, a, caps):
  _need(a.kind in (K.GLOBAL, K.LOOP, K.REDUCE), opt, k, f"cannot pad a {a.kind.value} axis")
  _need(opt.arg > 1, opt, k, f"the multiple must be > 1, got {opt.arg}")
  new = -(-a.size // opt.arg) * opt.arg
  if new == a.size: return k
  _need(new <= 2 * a.size, opt, k, f"padding {a.size} to {new} more than doubles the work")
  v = a.var
  taken = {x.var.name for x in k.axes}
  name = v.name + "p"
  while name in taken: name += "_"
  vp = sym.Var(name, 0, new - 1)
  inside = sym.Cond.range(sym.lin(vp), 0, a.size)
  k = substitute_kernel(k, {v: sym.lin(vp)}, {v: (vp,)}, k.axes[:opt.axis] + (Axis(vp, a.kind, a.end),) + k.axes[opt.axis + 1:])
  # (a kernel without reductions keeps its guards: a wrapped index would put a modulo where a split loop removed one;
  # so does an axis that loads read along by 1, where the device has masked vectors: its last vector is a masked
  # load (a padded column panel), where a wrapped one would be gathered lane by lane)
  wrap = bool(_reduces(k)) and not (caps.masked_vectors and _read_along(k, vp))
  return guard(k, vp, inside, wrap=a.size if wrap else 0)


# the two parts of a peeled reduction (_peel) folded by this op
_PEEL_FOLD = {"SUM": "ADD", "MAX": "MAX", "MIN": "MIN"}


def _peel(k, opt, a, caps):
  """Reduction axis a (size s) becomes its first s - s % arg indices (the axis, renamed) and the s % arg after them
  (a new REDUCE axis right after it): every reduction over a is the fold (_PEEL_FOLD) of the reduction over the first
  part and the one over the tail, each with its own accumulators. The first part is then whole vectors of any
  divisor of arg (no masked lanes in its loop), where padding the axis (PADTO) would mask the last vectors of every
  step (a masked vector's bounds change each step: a sum of exps over a vocabulary of 50257, 25 ms padded, peeled
  18)."""
  _need(a.kind is K.REDUCE, opt, k, f"only a reduction axis is peeled, this one is {a.kind.value}")
  _need(a.end is None, opt, k, f"the axis {a} has a size known at run time only")
  _need(opt.arg > 1, opt, k, f"the multiple must be > 1, got {opt.arg}")
  main, tail = a.size - a.size % opt.arg, a.size % opt.arg
  _need(main > 0 and tail > 0, opt, k, f"{a.size} is no multiple of {opt.arg} plus a tail")
  reds = [r for r in _reduces(k) if a.var in r.loops]
  for r in reds:
    _need(r.op in _PEEL_FOLD and not r.more, opt, k, f"a {r.op} reduction over the axis has no fold of two parts")
    # (two loops over the same outer axes, one per part, would not nest in one loop over them: linearize)
    _need(r.loops == (a.var,), opt, k, f"a reduction over {list(r.loops)}: only a reduction over the axis alone peels")
  taken = {x.var.name for x in k.axes}
  name = a.var.name
  while name + "m" in taken or name + "t" in taken: name += "_"
  vm, vt = sym.Var(name + "m", 0, main - 1), sym.Var(name + "t", 0, tail - 1)
  replaced = {}
  for r in reds:
    head = substitute([r], {a.var: sym.lin(vm)}, {a.var: (vm,)})[0]
    rest = substitute([r], {a.var: sym.lin(vt) + main}, {a.var: (vt,)})[0]
    replaced[id(r)] = Alu(_PEEL_FOLD[r.op], r.dtype, (head, rest))
  roots = [st.value for st in k.stores]
  vals = substitute(roots, {}, None, replaced)
  stores = tuple(Store(st.buf, st.idx, v, st.valid, st.lanes) for st, v in zip(k.stores, vals))
  axes = k.axes[:opt.axis] + (Axis(vm, K.REDUCE), Axis(vt, K.REDUCE)) + k.axes[opt.axis + 1:]
  return replace(k, stores=stores, axes=axes)


def _read_along(k: Kernel, var) -> bool:
  """Does some load of k step by 1 along var?"""
  return any(isinstance(v, Load) and dict(sym.lin(v.idx).terms).get(var) == 1
             for st in k.stores for v in toposort([st.value]))


def tc_axes(k: Kernel, kaxis: Axis, tc) -> tuple | str:
  """(M, N): the output axes a tensor core tc computes when kaxis is K, or a string saying why the kernel is no such
  matmul: one SUM reduction over kaxis accumulating in tc's dtype, of a product of two loads of its input dtype
  (codegen/opt/tc.product_loads), both reading along K; M an output axis only A's index uses (the last such), N one
  only B's uses; A is the operand whose own axis comes first (a matmul's rows)."""
  reds = _reduces(k)
  if len(reds) != 1: return f"a tensor core computes one matmul: the kernel has {len(reds)} reductions"
  r = reds[0]
  if r.op != "SUM" or kaxis.var not in r.loops: return f"the reduction over the axis must be a SUM, it is {r.op}"
  if r.dtype is not tc.dtype_acc: return f"the sum accumulates in {r.dtype.name}, {tc.name} in {tc.dtype_acc.name}"
  loads = tcs.product_loads(r.src, tc)
  if isinstance(loads, str): return f"{loads} ({tc.name})"
  da, db = ((axis_variables(x.idx) | x.valid.variables()) for x in loads)
  if kaxis.var not in da or kaxis.var not in db: return "both operands must read along the reduction axis"
  own = lambda mine, other: [x for x in k.of_kind(K.GLOBAL) if x.var in mine and x.var not in other]
  ma, mb = own(da, db), own(db, da)
  if not ma or not mb: return "no output axis that only one operand's index uses for each of M and N"
  if k.axis_index(mb[0].var) < k.axis_index(ma[0].var): ma, mb = mb, ma
  return ma[-1], mb[-1]


def _tc(k, opt, a, caps):
  """The kernel's matmul on a tensor core (tc_axes): its M, N and K (`a`) axes split by the tile's dims, the inner
  parts re-kinded TC_M, TC_N, TC_K, and a WARP axis of the warp's lanes added (last); codegen/passes.tensor_core turns
  the tile into the warp's Mma."""
  cores = caps.tensor_cores
  _need(bool(cores), opt, k, "the device has no tensor cores")
  _need(0 <= opt.arg < len(cores), opt, k, f"the device has {len(cores)} tensor cores, no entry {opt.arg}")
  tc = cores[opt.arg]
  _need(all(o.op is OptOp.PADTO for o in k.opts), opt, k,
        f"TC comes before any other action except PADTO (applied: {list(k.opts)})")
  _need(a.kind is K.REDUCE, opt, k, f"the axis must be the reduction axis K, this one is {a.kind.value}")
  mn = tc_axes(k, a, tc)
  _need(not isinstance(mn, str), opt, k, str(mn))
  m, n = mn
  for x, size, name in ((m, tc.dims[0], "M"), (n, tc.dims[1], "N"), (a, tc.dims[2], "K")):
    _need(x.size % size == 0, opt, k, f"the {name} axis {x} is not a multiple of {size} (PADTO first)")
    _need(x.end is None, opt, k, f"the {name} axis {x} has a size known at run time only")
  size = _local_items(k) * tc.threads
  _need(size <= caps.max_local, opt, k, f"a work-group of {size} exceeds the device's {caps.max_local}")
  for x, size, kind in ((m, tc.dims[0], K.TC_M), (n, tc.dims[1], K.TC_N), (a, tc.dims[2], K.TC_K)):
    k = _split(k, k.axis_index(x.var), size, kind)
  taken = {x.var.name for x in k.axes}
  name = "lane"
  while name in taken: name += "_"
  return replace(k, axes=k.axes + (Axis(sym.Var(name, 0, tc.threads - 1), K.WARP),), tensor_core=tc)


def _reduces(k: Kernel) -> list:
  return [v for v in toposort([st.value for st in k.stores]) if isinstance(v, Reduce)]


_APPLY = {OptOp.UPCAST: _upcast, OptOp.UNROLL: _unroll, OptOp.LOCAL: _local, OptOp.GROUP: _group, OptOp.SWAP: _swap,
          OptOp.PADTO: _padto, OptOp.LOOP: _loop, OptOp.STAGE: _stage, OptOp.TC: _tc, OptOp.PREFETCH: _prefetch,
          OptOp.READAHEAD: _read_ahead, OptOp.PIECES: _pieces, OptOp.PEEL: _peel}
