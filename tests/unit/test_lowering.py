"""codegen/lower: the canonical kernel of small programs. Its axes (by AxisKind, never by name), their sizes, its
buffers, loads and stores are the structure every later stage builds on; its values, run unoptimized on the numpy
interpreter (PYTHON: no compiler), are numpy's."""
from __future__ import annotations
import functools
import random
import numpy as np
import pytest
import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad import dtype as dt
from fusegrad.codegen.ir import (AxisKind, Alu, Const, Gather, Index, Load, Param, Reduce, axis_variables, dependencies,
                                 toposort)
from fusegrad.graph import symbolic as sym
from tests.unit.kernels import one_kernel, run

K = AxisKind
DEV = "PYTHON"


def _t(rng, *shape) -> tuple[fg.Tensor, np.ndarray]:
  a = rng.standard_normal(shape).astype(np.float32)
  return fg.Tensor(a, device=DEV).realize(), a


def _vals(k) -> list:
  return toposort([st.value for st in k.stores])


def _loads(k) -> list:
  return [v for v in _vals(k) if isinstance(v, Load)]


def _axes(k) -> list:
  return [(a.kind, a.size) for a in k.axes]


def _coefs(k, idx) -> dict:
  """An index expression's coefficients by axis position (and its kernel arguments by name), constant under None."""
  out = {None: sym.lin(idx).const} if sym.lin(idx).const else {}
  for atom, c in sym.lin(idx).terms:
    assert isinstance(atom, sym.Var), f"{idx} divides or takes a modulo"
    out[atom.name if isinstance(atom, sym.ArgVar) else k.axis_index(atom)] = c
  return out


def _grid(k, values) -> dict:
  """Every axis variable of k over its whole range (broadcast against each other) and its index arguments bound to
  their values: an environment in which sym.evaluate gives an expression's value at every point of the kernel."""
  env = {}
  for i, a in enumerate(k.axes):
    shape = [1] * len(k.axes)
    shape[i] = a.size
    env[a.var] = np.arange(a.size).reshape(shape)
  for v in k.arg_vars: env[v] = values[v.slot]
  return env


def test_elementwise_is_one_global_axis_over_the_flat_output(rng):
  """(a * 2 + b) of [8, 16]: contiguous in every buffer, its dims merge into one GLOBAL axis of 128 elements; the
  kernel has the output then the two inputs as buffers, two loads and one store at the flat position, no
  reduction, and no kernel arguments (2 is a literal: a power of two)."""
  (x, a), (y, b) = _t(rng, 8, 16), _t(rng, 8, 16)
  item = one_kernel(x * 2 + y)
  k = item.kernel
  assert _axes(k) == [(K.GLOBAL, 128)]
  assert [(b_.dtype, b_.size, b_.output) for b_ in k.bufs] == [(dt.float32, 128, True), (dt.float32, 128, False),
                                                                (dt.float32, 128, False)]
  o = sym.lin(k.axes[0].var)
  assert len(k.stores) == 1 and k.stores[0].buf == 0 and k.stores[0].idx == o and k.stores[0].valid.is_true
  loads = _loads(k)
  assert sorted(ld.buf for ld in loads) == [1, 2] and all(ld.idx == o and ld.valid.is_true for ld in loads)
  assert not any(isinstance(v, Reduce) for v in _vals(k))
  assert k.params == () and k.arg_vars == ()
  assert [c.value for c in _vals(k) if isinstance(c, Const)] == [2.0]
  np.testing.assert_allclose(run(item, ()), a * 2 + b, rtol=1e-6, atol=1e-6)


# (program, numpy, [(kind, size)] of the axes, op, {axis position: coefficient} of the load's index)
REDUCTIONS = {
  "rows": (lambda x: x.sum(1), lambda a: a.sum(1), (8, 16), [(K.GLOBAL, 8), (K.REDUCE, 16)], "SUM", {0: 16, 1: 1}),
  "cols": (lambda x: x.sum(0), lambda a: a.sum(0), (8, 16), [(K.GLOBAL, 16), (K.REDUCE, 8)], "SUM", {0: 1, 1: 16}),
  "full": (lambda x: x.sum(), lambda a: a.sum(), (8, 16), [(K.REDUCE, 8), (K.REDUCE, 16)], "SUM", {0: 16, 1: 1}),
  "max": (lambda x: x.amax(1), lambda a: a.max(1), (6, 10), [(K.GLOBAL, 6), (K.REDUCE, 10)], "MAX", {0: 10, 1: 1}),
  "outer": (lambda x: x.sum((0, 2)), lambda a: a.sum((0, 2)), (2, 3, 4), [(K.GLOBAL, 3), (K.REDUCE, 2), (K.REDUCE, 4)],
            "SUM", {0: 4, 1: 12, 2: 1}),
}


@pytest.mark.parametrize("case", list(REDUCTIONS))
def test_reduction_axes(case, rng):
  """A reduction's kept dims are GLOBAL axes (its result depends on each), its reduced dims REDUCE axes after them,
  the Reduce's loops are exactly those axes' variables, and the load walks the input by its strides: a row sum
  steps 1 along the reduction, a column sum the row's length. A full sum has no output axis and one output
  element, stored at position 0."""
  build, ref, shape, axes, op, coefs = REDUCTIONS[case]
  x, a = _t(rng, *shape)
  item = one_kernel(build(x))
  k = item.kernel
  assert _axes(k) == axes
  reds = [v for v in _vals(k) if isinstance(v, Reduce)]
  assert len(reds) == 1 and reds[0].op == op and reds[0].dtype == dt.float32
  assert reds[0].loops == tuple(ax.var for ax in k.of_kind(K.REDUCE))
  (ld,) = _loads(k)
  assert _coefs(k, ld.idx) == coefs and ld.valid.is_true
  outputs = int(np.prod([s for kind, s in axes if kind is K.GLOBAL]))
  assert k.bufs[0].size == outputs and k.bufs[1].size == a.size
  if case == "full": assert k.global_dims == () and k.stores[0].idx == sym.const(0)
  np.testing.assert_allclose(run(item, ()), ref(a), rtol=1e-5, atol=1e-5)


def test_matmul_is_two_global_axes_and_one_reduce_axis(rng):
  """[8, 12] @ [12, 16]: GLOBAL M and N, REDUCE K; one SUM of the product of two loads, A's index over (M, K) with
  strides (12, 1), B's over (K, N) with strides (16, 1), each plus its view's offset as an int64 argument (the
  offsets are 0 here); 2 M N K flops."""
  (x, a), (y, b) = _t(rng, 8, 12), _t(rng, 12, 16)
  item = one_kernel(x @ y)
  k = item.kernel
  assert _axes(k) == [(K.GLOBAL, 8), (K.GLOBAL, 16), (K.REDUCE, 12)]
  (red,) = [v for v in _vals(k) if isinstance(v, Reduce)]
  assert red.op == "SUM" and red.loops == (k.axes[2].var,)
  assert isinstance(red.src, Alu) and red.src.op == "MUL" and all(isinstance(s, Load) for s in red.src.src)
  la, lb = sorted(red.src.src, key=lambda ld: ld.buf)
  assert [la.buf, lb.buf] == [1, 2]
  pa, pb = (next(v.name for v in sym.variables(ld.idx) if isinstance(v, sym.ArgVar)) for ld in (la, lb))
  assert _coefs(k, la.idx) == {0: 12, 2: 1, pa: 1} and _coefs(k, lb.idx) == {2: 16, 1: 1, pb: 1}
  assert k.params == (dt.int64, dt.int64) and item.param_values() == [0, 0]
  assert k.flops == 2 * 8 * 16 * 12
  np.testing.assert_allclose(run(item, ()), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["row", "outer"])
def test_broadcast_loads_depend_only_on_their_own_axes(case, rng):
  """A broadcast operand is read without the axis it is expanded along: a bias [16] added to [8, 16] is indexed by
  the column axis alone, and an outer product [8, 1] * [1, 16] reads each operand by its own axis (so the output
  axes do not merge into one)."""
  if case == "row": (x, a), (y, b) = _t(rng, 8, 16), _t(rng, 16)
  else: (x, a), (y, b) = _t(rng, 8, 1), _t(rng, 1, 16)
  item = one_kernel(x * y)
  k = item.kernel
  assert _axes(k) == [(K.GLOBAL, 8), (K.GLOBAL, 16)]
  o0, o1 = (ax.var for ax in k.axes)
  deps = {ld.buf: axis_variables(ld.idx) for ld in _loads(k)}
  assert deps == ({1: {o0, o1}, 2: {o1}} if case == "row" else {1: {o0}, 2: {o1}})
  np.testing.assert_allclose(run(item, ()), a * b, rtol=1e-6, atol=1e-6)


def test_softmax_computes_its_reductions_once_per_row(rng):
  """softmax over the last dim of [4, 8]: its max and its sum depend on the row only, so the row is GLOBAL and the
  column a LOOP axis along which both are reused; each reduction has a REDUCE axis of its own."""
  x, a = _t(rng, 4, 8)
  item = one_kernel(x.softmax(-1))
  k = item.kernel
  assert _axes(k) == [(K.GLOBAL, 4), (K.LOOP, 8), (K.REDUCE, 8), (K.REDUCE, 8)]
  reds = [v for v in _vals(k) if isinstance(v, Reduce)]
  assert sorted(r.op for r in reds) == ["MAX", "SUM"]
  deps = dependencies([st.value for st in k.stores])
  assert all(deps[id(r)] == {k.axes[0].var} for r in reds)
  assert {r.loops for r in reds} == {(k.axes[2].var,), (k.axes[3].var,)}
  e = np.exp(a - a.max(-1, keepdims=True))
  np.testing.assert_allclose(run(item, ()), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


# movement ops over [3, 4, 5] (tensor, numpy): flat: the index may divide a flat position back into dims (a reshape
# of a permuted tensor cannot be expressed by strides)
VIEWS = {
  "permute": (lambda x: x.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), False),
  "flip": (lambda x: x.flip(0, 2), lambda a: a[::-1, :, ::-1], False),
  "stride": (lambda x: x[1:, ::2, 4:0:-2], lambda a: a[1:, ::2, 4:0:-2], False),
  "pad": (lambda x: F.pad(x, (2, 1, 0, 0, 1, 0)), lambda a: np.pad(a, ((1, 0), (0, 0), (2, 1))), False),
  "expand": (lambda x: x[:, :1].expand(3, 6, 5), lambda a: np.broadcast_to(a[:, :1], (3, 6, 5)), False),
  "mixed": (lambda x: F.pad(x.permute(1, 2, 0).flip(1)[::3], (0, 2)),
            lambda a: np.pad(a.transpose(1, 2, 0)[:, ::-1][::3], ((0, 0), (0, 0), (0, 2))), False),
  "reshape": (lambda x: x.permute(1, 0, 2).reshape(4, 15), lambda a: a.transpose(1, 0, 2).reshape(4, 15), True),
}


def _check_source_positions(item, src: tuple, view) -> None:
  """The kernel's one load, evaluated at every point of the kernel, reads where numpy's `view` of the source's
  positions (np.arange) says the output element lies, and is valid exactly where numpy's view of ones is (padding
  elsewhere); every output position is stored once. A view of padding only reads nothing at all (a one-element
  tensor may be read as an argument instead of a load)."""
  k = item.kernel
  want, valid = np.ravel(view(np.arange(int(np.prod(src))).reshape(src))), np.ravel(view(np.ones(src, bool)))
  if not _loads(k):
    assert not valid.any() or np.prod(src) == 1
    return
  (ld,) = _loads(k)
  env = _grid(k, item.param_values())
  shape = tuple(ax.size for ax in k.axes)
  at = np.broadcast_to(sym.evaluate(k.stores[0].idx, env), shape).ravel()
  pos = np.broadcast_to(sym.evaluate(ld.idx, env), shape).ravel()
  ok = np.broadcast_to(sym.evaluate_cond(ld.valid, env), shape).ravel()
  assert sorted(at.tolist()) == list(range(want.size))
  np.testing.assert_array_equal(ok, valid[at])
  np.testing.assert_array_equal(pos[ok], want[at][ok])


@pytest.mark.parametrize("case", list(VIEWS))
@pytest.mark.parametrize("computed", [False, True])
def test_views_index_their_source(case, computed, rng):
  """A permuted, flipped, strided, padded or broadcast view (of a buffer, or of a computed map: lower._aligned)
  becomes the load's index expression: evaluated at every point of the kernel where the load is valid, it is the
  source position numpy's view of np.arange holds there; where it is not valid the value is the padding's 0. Only a
  reshape that strides cannot express divides the flat position back into dims. The values are numpy's."""
  view, ref, divides = VIEWS[case]
  x, a = _t(rng, 3, 4, 5)
  item = one_kernel(view(x * 2 + 1 if computed else x) * 3)
  (ld,) = _loads(item.kernel)
  assert any(not isinstance(t, sym.Var) for t, _ in sym.lin(ld.idx).terms) == divides, ld.idx
  _check_source_positions(item, a.shape, ref)
  np.testing.assert_allclose(run(item, ()), ref((a * 2 + 1) if computed else a) * 3, rtol=1e-6, atol=1e-6)


def _random_movement(r: random.Random, shape: tuple):
  """A random movement op for a tensor of this shape: (tensor op, the same op on a numpy array)."""
  nd = len(shape)
  op = r.choice(["permute", "expand", "pad", "shrink", "flip", "stride", "reshape"])
  if op == "permute":
    order = list(range(nd))
    r.shuffle(order)
    return lambda t: t.permute(*order), lambda a: a.transpose(order)
  if op == "expand":
    new = tuple(r.randint(1, 3) if s == 1 else s for s in shape)
    return lambda t: t.expand(*new), lambda a: np.broadcast_to(a, new)
  if op == "pad":
    pads = [(r.randint(0, 2), r.randint(0, 2)) for _ in range(nd)]
    flat = tuple(p for lo, hi in reversed(pads) for p in (lo, hi))
    return lambda t: F.pad(t, flat), lambda a: np.pad(a, pads)
  if op in ("shrink", "stride"):
    sl = []
    for s in shape:
      lo = r.randint(0, s - 1)
      sl.append(slice(lo, r.randint(lo + 1, s)) if op == "shrink" else slice(None, None, r.randint(1, 3)))
    return lambda t: t[tuple(sl)], lambda a: a[tuple(sl)]
  if op == "flip":
    axes = [d for d in range(nd) if r.random() < 0.5] or [0]
    return lambda t: t.flip(axes), lambda a: np.flip(a, axes)
  n = int(np.prod(shape))
  d = r.choice([d for d in range(1, n + 1) if n % d == 0])
  new = (d, n // d) if r.random() < 0.6 else (n,)
  return lambda t: t.reshape(*new), lambda a: a.reshape(new)


@pytest.mark.parametrize("seed", range(4))
def test_random_view_chains(seed, rng):
  """Random chains of movement ops (fixed by the seed) over a buffer or over a computed map, each lowered to one
  kernel: its load reads the positions numpy's chain maps each output to (valid where numpy's chain of ones is),
  and its values on random inputs are numpy's."""
  r = random.Random(seed)
  for _ in range(10):
    shape = tuple(r.randint(1, 5) for _ in range(r.randint(1, 4)))
    x, a = _t(rng, *shape)
    computed = r.random() < 0.5
    t, ops, cur = (x * 2 + 1) if computed else x, [], shape
    for _ in range(r.randint(1, 5)):
      op, ref = _random_movement(r, cur)
      t = op(t)
      ops.append(ref)
      cur = tuple(t.shape)
    chain = lambda arr: functools.reduce(lambda acc, f: f(acc), ops, arr)
    item = one_kernel(t * 3)
    _check_source_positions(item, shape, chain)
    np.testing.assert_allclose(run(item, ()), chain(a * 2 + 1 if computed else a) * 3, rtol=1e-6, atol=1e-6)


def test_runtime_sized_reduction_is_one_kernel_for_every_size(rng):
  """x[:, :n].sum(1) with n a fusegrad.Variable in [1, 40]: the REDUCE axis spans the bound (40) and ends at a
  kernel argument (Axis.end, an ArgVar of an int64 slot) whose value is n; the kernels of two sizes are equal (one
  program serves both), and each sums exactly its first n columns."""
  x, a = _t(rng, 6, 40)
  V = fg.Variable("n", 1, 40)
  kernels = []
  for n in (int(rng.integers(2, 20)), int(rng.integers(20, 40))):
    item = one_kernel(x[:, :V.bind(n)].sum(1))
    k = item.kernel
    assert _axes(k) == [(K.GLOBAL, 6), (K.REDUCE, 40)]
    end = sym.lin(k.axes[1].end)
    assert len(end.terms) == 1 and end.terms[0][1] == 1 and end.const == 0
    v = end.terms[0][0]
    assert isinstance(v, sym.ArgVar) and (v.lo, v.hi) == (1, 40) and k.params[v.slot] == dt.int64
    assert item.param_values()[v.slot] == n
    assert k.bufs[1].size == 6 * 40
    np.testing.assert_allclose(run(item, ()), a[:, :n].sum(1), rtol=1e-5, atol=1e-5)
    kernels.append(k)
  assert kernels[0] == kernels[1]


def test_runtime_sized_output_is_stored_at_its_bound(rng):
  """An elementwise output with a runtime size (x[:, :n] * 2): its buffer is laid out at the bound (6 x 40), the
  runtime-sized axis runs over the bound and ends at the argument, and the store is guarded by it (what lies past n
  is never written); the values are numpy's for each n."""
  x, a = _t(rng, 6, 40)
  V = fg.Variable("n", 1, 40)
  for n in (int(rng.integers(2, 20)), int(rng.integers(20, 40))):
    item = one_kernel(x[:, :V.bind(n)] * 2)
    k = item.kernel
    assert _axes(k) == [(K.GLOBAL, 6), (K.GLOBAL, 40)]
    assert k.axes[0].end is None and k.axes[1].end is not None
    assert k.bufs[0].size == 6 * 40 and item.outputs[0].shape == (6, n)
    st = k.stores[0]
    assert not st.valid.is_true
    env = _grid(k, item.param_values())
    written = np.broadcast_to(sym.evaluate_cond(st.valid, env), (6, 40))
    np.testing.assert_array_equal(written, np.arange(40)[None, :].repeat(6, 0) < n)
    np.testing.assert_allclose(run(item, ()), a[:, :n] * 2, rtol=1e-6, atol=1e-6)


def test_python_numbers_are_kernel_arguments(rng):
  """x * 0.3 and x * 0.7 are one kernel: the number is a float32 Param (its value bound at launch); a power of two
  (0.5) is a literal (Const) of the kernel, and so is a small integer of an integer tensor, while a large one
  (1000) is an argument."""
  x, a = _t(rng, 5, 7)
  items = [one_kernel(x * c) for c in (0.3, 0.7)]
  assert items[0].kernel == items[1].kernel
  for item, c in zip(items, (0.3, 0.7)):
    params = [v for v in _vals(item.kernel) if isinstance(v, Param)]
    assert [(p.slot, p.dtype) for p in params] == [(0, dt.float32)] and item.kernel.params == (dt.float32,)
    assert np.float32(item.param_values()[0]) == np.float32(c)
    np.testing.assert_allclose(run(item, ()), a * np.float32(c), rtol=1e-6)
  half = one_kernel(x * 0.5)
  assert half.kernel.params == () and 0.5 in [v.value for v in _vals(half.kernel) if isinstance(v, Const)]
  ints = fg.Tensor(rng.integers(-100, 100, (4, 6)).astype(np.int32), device=DEV).realize()
  assert one_kernel(ints * 3).kernel.params == ()
  big = one_kernel(ints * 1000)
  assert big.kernel.params == (dt.int32,) and big.param_values() == [1000]
  np.testing.assert_array_equal(run(big, ()), ints.numpy() * 1000)


def test_integer_sum_accumulates_in_int64(rng):
  """An int32 row sum is int64 (as torch's): the int32 load is CAST to int64 inside the reduction, the accumulator
  and the output buffer are int64, and the values are exact (large enough to overflow an int32 accumulator)."""
  v = rng.integers(-2 ** 31, 2 ** 31, (16, 64), dtype=np.int64).astype(np.int32)
  item = one_kernel(fg.Tensor(v, device=DEV).realize().sum(1))
  k = item.kernel
  (red,) = [x for x in _vals(k) if isinstance(x, Reduce)]
  assert red.dtype == dt.int64 and [b.dtype for b in k.bufs] == [dt.int64, dt.int32]
  assert isinstance(red.src, Alu) and red.src.op == "CAST" and isinstance(red.src.src[0], Load)
  assert red.src.src[0].dtype == dt.int32
  got = run(item, ())
  assert got.dtype == np.int64
  np.testing.assert_array_equal(got, v.sum(1, dtype=np.int64))


def test_bitcast_is_one_alu_op(rng):
  """Tensor.view(int32) of a float32 tensor is one BITCAST of the load (no CAST): the bits, exactly."""
  x, a = _t(rng, 8, 8)
  item = one_kernel(x.view(fg.int32) ^ 5)
  bits = [v for v in _vals(item.kernel) if isinstance(v, Alu) and v.op in ("BITCAST", "CAST")]
  assert [(b.op, b.dtype, b.src[0].dtype) for b in bits] == [("BITCAST", dt.int32, dt.float32)]
  assert isinstance(bits[0].src[0], Load)
  np.testing.assert_array_equal(run(item, ()), a.view(np.int32) ^ 5)


def test_arange_reads_no_buffer():
  """arange(12) * 3: its values are the index itself (an Index value), the kernel's only buffer is its output."""
  item = one_kernel((fg.arange(12, device=DEV) * 3).reshape(3, 4))
  k = item.kernel
  assert len(k.bufs) == 1 and k.bufs[0].output and not _loads(k)
  (ix,) = [v for v in _vals(k) if isinstance(v, Index)]
  assert ix.idx == sym.lin(k.axes[0].var) and ix.dtype == dt.int64
  np.testing.assert_array_equal(run(item, ()), np.arange(12).reshape(3, 4) * 3)


def test_gather_reads_at_computed_positions(rng):
  """w[idx] with an int32 index tensor: a Gather from w's buffer (all its elements) at positions computed from the
  loaded indices (negative ones wrap, as numpy's)."""
  w, wn = _t(rng, 5, 6)
  iv = rng.integers(-5, 5, 7).astype(np.int32)
  item = one_kernel(w[fg.Tensor(iv, device=DEV).realize()])
  k = item.kernel
  (g,) = [v for v in _vals(k) if isinstance(v, Gather)]
  assert k.bufs[g.buf].size == 30 == g.size and g.dtype == dt.float32
  assert _axes(k) == [(K.GLOBAL, 7), (K.GLOBAL, 6)]
  np.testing.assert_array_equal(run(item, ()), wn[iv])
