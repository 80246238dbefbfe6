"""Vector values (codegen/passes.vector_axes, ir.VecDType): an UPCAST axis of a vector width becomes vector loads,
arithmetic, accumulators and stores in C (GCC vector extensions) and OpenCL C. Each case runs the kernel with
actions on a compiling device and compares with the interpreter (PYTHON: no vectors, the canonical kernel)."""
from __future__ import annotations
import re
import numpy as np
import pytest
import fusegrad as fg
from fusegrad.codegen.opt import Opt, OptOp, heuristic
from fusegrad.runtime import device as rd
from unit.kernels import one_kernel, run


def _devices():
  out = ["CPU"]
  try:
    rd.get("OPENCL")
    out.append("OPENCL")
  except Exception:
    pass
  return out


DEVICES = _devices()
VEC = {"CPU": "fg_float32x", "OPENCL": "float"}
# the widest vector of each device (its caps: the CPU's are those this host holds in one register, 16 or 8 lanes)
W = {d: max(rd.get(d).caps.vector_widths) for d in DEVICES}


def _t(rng, dev, *shape):
  return fg.Tensor(rng.standard_normal(shape).astype(np.float32), device=dev)


def _ref(item, opts=()):
  """The kernel (canonical, or with opts: scalar accumulators) run by the interpreter on the same input buffers."""
  pdev = rd.get("PYTHON")
  c = pdev.compile_with(item.kernel, opts)
  outs = [rd.Buffer(pdev, o.numel, o.dtype) for o in item.outputs]
  ins = [rd.Buffer(pdev, i.numel, i.dtype).copyin(i.buffer.numpy()) for i in item.inputs]
  params = pdev.param_handles(item.kernel, item.param_values()) if item.kernel.params else []
  pdev.launch(c.program, c.kernel, [b.handle for b in outs + ins] + params)
  return outs[0].numpy().reshape(item.outputs[0].shape)


def _inner(out: fg.Tensor) -> int:
  """The index of the innermost axis of out's kernel (an elementwise kernel over contiguous buffers has one axis:
  lowering merges the output axes every index reads as one, codegen/lower.merge_axes)."""
  return len(one_kernel(out).kernel.axes) - 1


def _run(out: fg.Tensor, opts, dev: str, vector: int | None) -> tuple[np.ndarray, np.ndarray]:
  """(out's kernel with opts on dev, the canonical kernel on the interpreter); `vector`: the vector width the
  kernel's source must use (None: no vectors at all)."""
  item = one_kernel(out)
  c = rd.get(dev).compile_with(item.kernel, opts)
  body = c.source[c.source.rindex(f"void {c.kernel.name}("):]
  if vector: assert f"{VEC[dev]}{vector}" in body, body
  else: assert not re.search(r"fg_float32x|float(4|8|16)\b|vload\d", body), body
  return run(item, opts, dev), _ref(item)


@pytest.mark.parametrize("dev", DEVICES)
def test_matmul_register_tile_is_vectors(dev, rng):
  a, b = _t(rng, dev, 64, 40), _t(rng, dev, 40, 128)
  item = one_kernel(a @ b)
  opts = heuristic.hand_coded(item.kernel, rd.get(dev).caps) if dev == "CPU" else \
      (Opt(OptOp.UPCAST, 1, W[dev]), Opt(OptOp.UPCAST, 0, 4))
  got, want = _run(a @ b, opts, dev, W[dev])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got, a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dev", DEVICES)
def test_sum_lanes_fold_in_the_scalar_order(dev, rng):
  """A reduction axis upcast by 8 keeps a vector accumulator folded lane by lane in order: the same bits as the
  interpreter's scalar accumulators folded in order."""
  x = (_t(rng, dev, 6, 512) * 1000).realize()
  opts = (Opt(OptOp.UPCAST, 1, 8),)
  got, want = _run(x.sum(1), opts, dev, 8)
  np.testing.assert_array_equal(got, _ref(one_kernel(x.sum(1)), opts))
  # float32 sums in another order than numpy's: apart by up to n * eps * sum |x| (a row summing near 0 cancels)
  bound = 512 * 2.0 ** -24 * float(np.abs(x.numpy()).sum(1).max())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=bound)


@pytest.mark.parametrize("dev", DEVICES)
def test_max_and_min_lanes_propagate_nan(dev, rng):
  x = rng.standard_normal((4, 64)).astype(np.float32)
  x[1, 37] = np.nan
  x[3, 0] = np.nan
  t = fg.Tensor(x, device=dev)
  for red in (lambda v: v.amax(1), lambda v: v.amin(1)):
    got, want = _run(red(t), (Opt(OptOp.UPCAST, 1, W[dev]),), dev, W[dev])
    np.testing.assert_array_equal(np.isnan(got), [False, True, False, True])
    np.testing.assert_array_equal(got, want)
  # elementwise maximum with NaN on either side
  y = rng.standard_normal((4, 64)).astype(np.float32)
  y[0, 3] = np.nan
  u = fg.Tensor(y, device=dev)
  got, want = _run(fg.maximum(t, u), (Opt(OptOp.UPCAST, _inner(fg.maximum(t, u)), W[dev]),), dev, W[dev])
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, np.maximum(x, y))


@pytest.mark.parametrize("dev", DEVICES)
def test_elementwise_arithmetic(dev, rng):
  a, b, c = _t(rng, dev, 8, 64), _t(rng, dev, 8, 64), _t(rng, dev, 8, 64)
  out = -(a * 2 + b) / (c.sin() + 2) - fg.minimum(a, b)
  # sin is not a vector op: the kernel stays scalar (and right)
  got, want = _run(out, (Opt(OptOp.UPCAST, _inner(out), 8),), dev, None)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  out = -(a * 2 + b) / (c * c + 1) - fg.minimum(a, b)
  got, want = _run(out, (Opt(OptOp.UPCAST, _inner(out), 8),), dev, 8)
  # a compiler may contract c * c + 1 into one fused multiply-add (C and OpenCL allow it): an ulp, then cancellation
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_reciprocal_is_a_vector_op(dev, rng):
  """1 / x (a sigmoid's and a BCE gradient's RECIP) keeps a kernel in vectors (scalar, the VAE's BCE backward ran
  40 ns an element); zero and infinities as the scalar op gives them."""
  a, b = _t(rng, dev, 8, 64), _t(rng, dev, 8, 64)
  out = (a * a + 1).reciprocal() - (a * b).exp().reciprocal()   # (denominators away from 0: a GPU contracts a*b+1)
  got, want = _run(out, (Opt(OptOp.UPCAST, _inner(out), 8),), dev, 8)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  x = np.array([0.0, -0.0, np.inf, -np.inf, 2.0, -4.0, 1e-30, 3.0] * 8, np.float32)
  got, want = _run(fg.Tensor(x, device=dev).reciprocal(), (Opt(OptOp.UPCAST, 0, 8),), dev, 8)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, np.reciprocal(x))


@pytest.mark.parametrize("dev", DEVICES)
def test_strided_and_padded_loads_and_strided_stores(dev, rng):
  a, b, c = _t(rng, dev, 32, 48), _t(rng, dev, 48, 32), _t(rng, dev, 32, 1)
  # a transposed operand: its lanes are one load each
  got, want = _run(a + b.T, (Opt(OptOp.UPCAST, 1, W[dev]),), dev, W[dev])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # the vector axis across rows: loads and stores a row apart (a per-row operand keeps the rows an axis of their own)
  assert len(one_kernel((a + c) * 3).kernel.axes) == 2
  got, want = _run((a + c) * 3, (Opt(OptOp.UPCAST, 0, W[dev]),), dev, W[dev])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # padding: lanes past the edge read 0, each under its own condition
  p = fg.nn.functional.pad(a, (3, 5, 0, 0)) * 2
  got, want = _run(p, (Opt(OptOp.UPCAST, 1, 8),), dev, 8)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_padded_map_is_masked_vectors(rng):
  """A map padded on both sides (a 3x3 convolution's input, [2, 4, 10, 56] -> [.., 12, 58]): the heuristic keeps its
  columns in vectors (no PIECES of one column each at the pad's bounds) and pads them to whole native vectors; each
  vector's load is masked to the lanes that hold both the pad's range and the padded axis's (`1 <= w < 57` and
  `w < 58`, offsets of one index: passes._lane_range intersects them), not loaded lane by lane. Values exact against
  numpy, on the CPU and through the interpreter."""
  caps = rd.get("CPU").caps
  a = rng.standard_normal((2, 4, 10, 56)).astype(np.float32)
  a[0, 0, 0, :3] = -0.0
  p = fg.nn.functional.pad(fg.Tensor(a), (1, 1, 1, 1)) * 2
  item = one_kernel(p)
  opts = heuristic.hand_coded(item.kernel, caps)
  assert not any(o.op is OptOp.PIECES for o in opts), opts
  c = rd.get("CPU").compile_with(item.kernel, tuple(opts))
  body = c.source[c.source.rindex(f"void {c.kernel.name}("):]
  assert "fg_vloadm" in body and not re.search(r"\?b1\[", body), body
  want = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))) * 2
  for dev in ("CPU", "PYTHON"):
    got = run(item, tuple(opts), dev)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    assert np.array_equal(np.signbit(got.reshape(want.shape)), np.signbit(want))


@pytest.mark.parametrize("dev", DEVICES)
def test_other_dtypes_stay_scalar(dev, rng):
  x = fg.Tensor(rng.integers(-50, 50, (4, 64)).astype(np.int32), device=dev)
  got, want = _run(x.sum(1), (Opt(OptOp.UPCAST, 1, 8),), dev, None)
  np.testing.assert_array_equal(got, want)
  h = fg.Tensor(rng.standard_normal((4, 64)).astype(np.float16), device=dev)
  got, want = _run(h * 2 + 1, (Opt(OptOp.UPCAST, _inner(h * 2 + 1), 8),), dev, None)
  np.testing.assert_array_equal(got, want)


def test_heuristic_vectorizes_elementwise_and_big_matmul_packs(rng):
  """CPU defaults: an elementwise kernel of vector ops runs in vectors; a large float32 matmul reads its right
  operand from panels (one extra copy kernel) and still matches numpy."""
  a, b = _t(rng, "CPU", 64, 256), _t(rng, "CPU", 64, 256)
  item = one_kernel(a * b + a)
  opts = heuristic.hand_coded(item.kernel, rd.get("CPU").caps)
  assert [o.op for o in opts] == [OptOp.UPCAST] and opts[0].arg == W["CPU"]
  x, w = _t(rng, "CPU", 1024, 128), _t(rng, "CPU", 128, 256)
  with fg.track() as tr:
    y = (x @ w).numpy()
  assert len(tr.kernels) == 2
  np.testing.assert_allclose(y, x.numpy() @ w.numpy(), rtol=1e-4, atol=1e-4)
  # a batch of 256 rows does not repay the copy (schedule/rules.PANEL_MIN_ROWS): one kernel
  with fg.track() as tr:
    y = (x[:256] @ w).numpy()
  assert len(tr.kernels) == 1
  np.testing.assert_allclose(y, x.numpy()[:256] @ w.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_padded_reduction_lanes_on_cpu(dtype, rng):
  """A reduction axis in lanes, then padded: the loop body is conditional on the loop and feeds interleaved
  accumulators, which gcc 12.2 -O2 -march=native miscompiled (runtime/cpu.py GCC_FLAGS)."""
  x = rng.integers(-50, 50, (16, 64)).astype(dtype)
  t = fg.Tensor(x, device="CPU")
  item = one_kernel(t.sum(1))
  for opts in ((Opt(OptOp.UPCAST, 1, 8), Opt(OptOp.PADTO, 1, 16)), (Opt(OptOp.UPCAST, 1, 2), Opt(OptOp.PADTO, 1, 64))):
    np.testing.assert_array_equal(run(item, opts, "CPU"), x.sum(1, dtype=np.int64 if dtype == np.int32 else dtype))


@pytest.mark.parametrize("device", [d for d in ("CPU", "OPENCL") if d in DEVICES])
def test_vector_exp_is_the_scalar_exp(device, rng):
  """exp is a vector op (passes.VECTOR_OPS): the C prelude's fg_vexp runs fg_expf's steps lane-wise (so no kernel's
  speed hangs on the compiler's vectorizer), OpenCL calls fg_expf per lane; either gives the scalar kernel's bits,
  special values included (inf, NaN, the clamps, underflow to 0), within 1 ulp of float64's exp."""
  v = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 40,
                      np.array([np.nan, np.inf, -np.inf, 88.7, 88.8, 88.9, -103.9, -103.98, -104.1, -150, 0, -0.0, 1e-30,
                                -87.3, 0.5, -0.5, 1.5, 2.5, -2.5], np.float32)])
  v = np.resize(v, 4096 + 64).astype(np.float32)
  x = fg.Tensor(v, device=device).realize()
  item = one_kernel(x.exp())
  opts = [Opt(OptOp.UPCAST, 0, 8)]
  vec = run(item, opts, device)
  src = rd.get(device).compile_with(item.kernel, opts).source
  assert "fg_vexp_" in src[src.rindex(f"void {item.kernel.name}("):] or device != "CPU"
  np.testing.assert_array_equal(vec.view(np.uint32), run(item, (), device).view(np.uint32))
  with np.errstate(over="ignore"):
    ref = np.exp(v.astype(np.float64))
  fin = np.isfinite(ref) & (ref < 3e38)
  np.testing.assert_allclose(vec[fin], ref[fin], rtol=2.5e-7, atol=1e-37)


@pytest.mark.parametrize("device", [d for d in ("CPU", "OPENCL") if d in DEVICES])
@pytest.mark.parametrize("fn", ["log", "tanh", "erf"])
def test_vector_math_is_the_scalar_math(device, fn, rng):
  """log, tanh and erf are vector ops too (the C prelude's fg_vlog/fg_vtanh/fg_verf: the scalar functions' steps on
  vectors; OpenCL: the scalar function per lane): the scalar kernel's values at every vector width, special values
  included (subnormals, 0, -0, inf, NaN, negatives for log; the branch points of tanh and the clamps of erf)."""
  special = {"log": [np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1e-40, 1e-45, 1.17549435e-38, 0.7071067, 0.7071068, 1.0,
                     3.4e38],
             "tanh": [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.6249, 0.625, -0.625, 19.99, 20.0, 25.0, -30.0, 1e-30],
             "erf": [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.99, 4.0, 4.01, -4.0, -9.0, 1e-30, 0.5, -0.5]}[fn]
  body = rng.standard_normal(2048).astype(np.float32) * 3
  if fn == "log": body = np.abs(body) * np.float32(10.0) ** rng.integers(-30, 30, 2048).astype(np.float32)
  v = np.resize(np.concatenate([body, np.array(special, np.float32)]), 2048 + 64).astype(np.float32)
  x = fg.Tensor(v, device=device).realize()
  item = one_kernel(getattr(x, fn)())
  scalar = run(item, (), device)
  for w in sorted({8, W[device]}):
    opts = [Opt(OptOp.UPCAST, 0, w)]
    src = rd.get(device).compile_with(item.kernel, opts).source
    if device == "CPU": assert f"fg_v{fn}_" in src[src.rindex(f"void {item.kernel.name}("):]
    got = run(item, opts, device)
    # the same steps; a compiler may contract a multiply-add into an FMA in one and not the other (gcc, AVX2: log
    # once in a few thousand values): 1 ulp
    np.testing.assert_array_equal(np.isnan(got), np.isnan(scalar))
    np.testing.assert_array_max_ulp(np.nan_to_num(got), np.nan_to_num(scalar), maxulp=1)
  with np.errstate(divide="ignore", invalid="ignore"):
    import math
    ref = {"log": np.log(v.astype(np.float64)), "tanh": np.tanh(v.astype(np.float64)),
           "erf": np.array([math.erf(t) if np.isfinite(t) else (np.sign(t) if not np.isnan(t) else np.nan)
                            for t in v.astype(np.float64)])}[fn]
  np.testing.assert_allclose(scalar, ref, rtol=1e-6, atol=1e-6 if fn != "log" else 0)


@pytest.mark.parametrize("dev", DEVICES)
def test_comparisons_are_lane_masks(dev, rng):
  """A comparison of float32 vectors read only as a condition is a lane mask (C: an int32 vector of all-ones lanes;
  OpenCL: select): a ReLU, a where() on a computed condition, a ReLU's gradient `(x > 0) * g`, and a where() whose
  condition does not move along the vector (one select of two vectors). sqrt is a vector op too. Each gives the
  scalar kernel's bits (NaN compares false in both) and numpy's values."""
  x = rng.standard_normal((8, 64)).astype(np.float32)
  x[1, 5], x[2, 0], x[4, 9] = np.nan, np.inf, -np.inf
  g = rng.standard_normal((8, 64)).astype(np.float32)
  c = rng.standard_normal((8, 1)).astype(np.float32)
  tx, tg, tc = (fg.Tensor(v, device=dev) for v in (x, g, c))
  cases = [(tx.relu(), np.where(x <= 0, 0, x)),
           (fg.where(tx > 0.5, tx * 2, (tx.abs() + 1).sqrt()), np.where(x > 0.5, x * 2, np.sqrt(np.abs(x) + 1))),
           ((tx > 0).float() * tg, (x > 0) * g),
           (fg.where(tc > 0, tx, tg), np.where(c > 0, x, g))]
  mask = {"CPU": "fg_int32x", "OPENCL": "select("}[dev]
  for out, want in cases:
    item = one_kernel(out)
    opts = (Opt(OptOp.UPCAST, len(item.kernel.axes) - 1, W[dev]),)
    src = rd.get(dev).compile_with(item.kernel, opts).source
    body = src[src.rindex(f"void {item.kernel.name}("):]
    assert f"{VEC[dev]}{W[dev]}" in body, body
    if out is not cases[3][0]: assert mask in body, body
    got = run(item, opts, dev)
    np.testing.assert_array_equal(got.view(np.uint32), run(item, (), dev).view(np.uint32))
    with np.errstate(invalid="ignore"):
      np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(_ref(item, opts), want, rtol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_random_bits_are_integer_lanes(dev, rng):
  """A random draw made in the kernel that reads it (a dropout mask: a hash of each element's index, tensor's counter
  based draw) runs in 32-bit integer vectors (passes.VECTOR_INT_OPS): the index as a vector of its lanes, xor,
  multiply and constant shifts, the bits turned into floats by a vector convert. The same bits as the scalar kernel,
  for a shape whose rows are no multiple of the vector either; the CPU's default actions pick the vectors."""
  for shape in ((4, 64), (3, 5, 48)):
    x = _t(rng, dev, *shape)
    fg.manual_seed(int(rng.integers(1 << 30)))
    out = fg.nn.functional.dropout(x, 0.3) * (x * 0.5).exp()
    item = one_kernel(out)
    opts = (Opt(OptOp.UPCAST, len(item.kernel.axes) - 1, 8),)
    src = rd.get(dev).compile_with(item.kernel, opts).source
    body = src[src.rindex(f"void {item.kernel.name}("):]
    assert {"CPU": "fg_uint32x8", "OPENCL": "uint8"}[dev] in body, body
    got = run(item, opts, dev)
    np.testing.assert_array_equal(got.view(np.uint32), run(item, (), dev).view(np.uint32))
    ref = _ref(item, opts)   # (the interpreter's exp is numpy's: an ulp apart; its mask is the same)
    kept = got != 0
    np.testing.assert_array_equal(kept, ref != 0)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert 0.5 < kept.mean() < 0.9   # (p = 0.3: of 256 or 720 draws)
    np.testing.assert_allclose(got[kept], (x.numpy() / 0.7 * np.exp(x.numpy() * 0.5))[kept], rtol=1e-5)
  # the bits themselves stored (a schedule may keep a random draw's bits in a buffer): uint32 vector stores
  from fusegrad.tensor import _random_bits
  fg.manual_seed(int(rng.integers(1 << 30)))
  bits = _random_bits(8 * 64, dev)
  item = one_kernel(bits)
  opts = (Opt(OptOp.UPCAST, len(item.kernel.axes) - 1, 8),)
  src = rd.get(dev).compile_with(item.kernel, opts).source
  assert {"CPU": "fg_uint32x8", "OPENCL": "uint8"}[dev] in src[src.rindex(f"void {item.kernel.name}("):]
  got = run(item, opts, dev)
  np.testing.assert_array_equal(got, run(item, (), dev))
  np.testing.assert_array_equal(got, _ref(item, opts))
  assert len(np.unique(got)) > 500
  # and read back from the buffer into floats (uint32 vector loads, a shift, a vector convert)
  stored = bits.realize()
  item = one_kernel(((stored >> 8).float() * (1.0 / (1 << 24))).reshape(8, 64) * 2 - 1)
  opts = (Opt(OptOp.UPCAST, len(item.kernel.axes) - 1, 8),)
  src = rd.get(dev).compile_with(item.kernel, opts).source
  assert {"CPU": "fg_vload_fg_uint32x8(", "OPENCL": "uint8"}[dev] in src[src.rindex(f"void {item.kernel.name}("):]
  got = run(item, opts, dev)
  np.testing.assert_array_equal(got, run(item, (), dev))
  np.testing.assert_array_equal(got, ((stored.numpy() >> 8).astype(np.float32) / (1 << 24)).reshape(8, 64) * 2 - 1)
  # read under a guard along the lanes (padding): lane by lane into a vector, the rest still vectors
  want = (np.pad(stored.numpy().reshape(8, 64)[:, :60], ((0, 0), (2, 2))) >> 8).astype(np.float32) * 3
  item = one_kernel((fg.nn.functional.pad(stored.reshape(8, 64)[:, :60], (2, 2)) >> 8).float() * 3)
  opts = (Opt(OptOp.UPCAST, len(item.kernel.axes) - 1, 8),)
  src = rd.get(dev).compile_with(item.kernel, opts).source
  assert {"CPU": "fg_uint32x8", "OPENCL": "uint8"}[dev] in src[src.rindex(f"void {item.kernel.name}("):]
  np.testing.assert_array_equal(run(item, opts, dev), want)
  if dev == "CPU":
    fg.manual_seed(1)
    c = rd.get("CPU").compiled(one_kernel(fg.nn.functional.dropout(_t(rng, dev, 20, 200), 0.2) * 3).kernel)
    assert "fg_uint32x" in c.source[c.source.rindex(f"void {c.kernel.name}("):]


@pytest.mark.parametrize("dev", ["PYTHON"] + DEVICES)
def test_several_vector_axes_in_one_kernel(dev, rng):
  """A softmax's kernel has three loops over its row: the max, the sum of exp(x - max), and the outputs. The
  heuristic gives each vector lanes, and each becomes its own vectors (passes.vector_axes: no value is along two of
  them); the outputs' vector store stays one store when the later axes are vectorized. Values match numpy, NaN rows
  included; so does a layer norm (mean, variance, outputs)."""
  x = rng.standard_normal((16, 512)).astype(np.float32) * 3
  x[3, 7] = np.nan
  t = fg.Tensor(x, device=dev)
  item = one_kernel(t.softmax(-1))
  # the CPU's choice of actions (on OPENCL: with its 8-lane vectors)
  from dataclasses import replace
  caps = rd.get(dev).caps if dev != "OPENCL" else replace(rd.get("CPU").caps, vector_widths=(2, 4, 8), native_lanes=8)
  opts = heuristic.hand_coded(item.kernel, caps)
  from fusegrad.codegen import passes
  from fusegrad.codegen.opt.actions import apply_opts
  from fusegrad.codegen.ir import dependencies
  ko = apply_opts(item.kernel, opts, rd.get(dev).caps)
  assert len(passes.vector_axes(ko, rd.get(dev).caps, dependencies([st.value for st in ko.stores]))) == 3, opts
  got = run(item, opts, dev)
  e = np.exp(x - x.max(-1, keepdims=True))
  want = e / e.sum(-1, keepdims=True)
  assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, 0)).any()
  np.testing.assert_allclose(np.delete(got, 3, 0), np.delete(want, 3, 0), rtol=1e-5, atol=1e-7)
  y = x.copy()
  y[3, 7] = 0
  t = fg.Tensor(y, device=dev)
  item = one_kernel(fg.nn.functional.layer_norm(t, (512,)))
  got = run(item, heuristic.hand_coded(item.kernel, caps), dev)
  want = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


_AVX2_PROGRAM = r"""
import numpy as np, fusegrad as fg, fusegrad.nn.functional as F
from fusegrad.runtime import cpu, device as rd
assert cpu.host_vectors() == (16, 8, "AVX2") and rd.get("CPU").caps.native_lanes == 8
assert "-mno-avx512f" in cpu.compiler_flags()
rng = np.random.default_rng(int.from_bytes(__import__("os").urandom(4), "little"))
a, b = rng.standard_normal((96, 160), dtype=np.float32), rng.standard_normal((160, 64), dtype=np.float32)
np.testing.assert_allclose((fg.Tensor(a) @ fg.Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
s = rng.standard_normal((64, 256), dtype=np.float32) * 4
e = np.exp(s - s.max(-1, keepdims=True))
np.testing.assert_allclose(fg.Tensor(s).softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
np.testing.assert_allclose(fg.Tensor(s).sum().item(), s.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
x = fg.Tensor(rng.standard_normal((2, 16, 12, 12), dtype=np.float32), requires_grad=True)
w = fg.Tensor(rng.standard_normal((16, 16, 3, 3), dtype=np.float32) / 12, requires_grad=True)
y = F.conv2d(x, w, padding=1)
y.sum().backward()
import torch
xt, wt = torch.tensor(x.numpy(), requires_grad=True), torch.tensor(w.numpy(), requires_grad=True)
yt = torch.nn.functional.conv2d(xt, wt, padding=1)
yt.sum().backward()
np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-3)
print("ok")
"""


def _host_has_avx2() -> bool:
  from fusegrad.runtime.cpu import _host_id   # the host's /proc/cpuinfo flags, as the CPU device reads them
  return any(line.startswith("flags") and "avx2" in line.split() for line in _host_id().splitlines())


@pytest.mark.skipif(not _host_has_avx2(), reason="FUSEGRAD_CPU_ISA=avx2 builds AVX2 code: this host has no AVX2")
def test_avx2_build_on_this_host(tmp_path):
  """FUSEGRAD_CPU_ISA=avx2 compiles for AVX2 even on an AVX-512 host (the code an AVX2-only CPU gets: 8-lane
  vectors, 16 registers, the register tiles sized for them): a matmul, softmax, sum and a convolution with its
  gradients match numpy and torch. Its own cache directory: those binaries are keyed apart from native ones."""
  import os, subprocess, sys
  env = dict(os.environ, FUSEGRAD_CPU_ISA="avx2", FUSEGRAD_CACHE_DIR=str(tmp_path / "cache"))
  r = subprocess.run([sys.executable, "-c", _AVX2_PROGRAM], env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
  env["FUSEGRAD_CPU_ISA"] = "avx9"
  r = subprocess.run([sys.executable, "-c", "import fusegrad"], env=env, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode != 0 and "FUSEGRAD_CPU_ISA must be one of native, avx2" in r.stderr, r.stderr


_MASKED_HARNESS = r'''
#include <stdio.h>
int main(void) {
  float p[64], q[64]; int bad = 0;
  for (int i = 0; i < 64; i++) p[i] = i + 1;
  for (int n = 4; n <= 16; n *= 2) for (int lo = -3; lo <= n + 2; lo++) for (int hi = -2; hi <= n + 3; hi++) {
    float got[16];
    for (int i = 0; i < 64; i++) q[i] = -1;
#define CASE(N) if (n == N) { fg_float32x##N v = fg_vloadm_fg_float32x##N(p + 8, lo, hi); \
      for (int i = 0; i < N; i++) got[i] = v[i]; fg_vstorem_fg_float32x##N(q + 8, v, lo, hi); }
    CASE(4) CASE(8) CASE(16)
    for (int i = 0; i < n; i++) if (got[i] != ((i >= lo && i < hi) ? p[8 + i] : 0)) bad++;
    for (int i = 0; i < 64; i++) {
      int j = i - 8;
      if (q[i] != ((j >= 0 && j < n && j >= lo && j < hi) ? p[i] : -1)) bad++;
    }
  }
  printf("bad %d\n", bad);
  return bad != 0;
}
'''


def test_masked_loads_and_stores_in_c(tmp_path):
  """The C prelude's masked vector loads and stores (ir.Load.lanes: a padded axis's last vector) read and write
  exactly lanes lo <= i < hi, whatever the range (empty, past either end), with the machine's compiler, through each
  of its paths: AVX-512's masked moves (-march=native here), AVX's vmaskmovps, and lane by lane."""
  import os, subprocess
  from fusegrad.codegen.renderer.cstyle import _C_PRELUDE
  from fusegrad.runtime.cpu import find_compiler
  cc, _ver = find_compiler()
  flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
  src = tmp_path / "masked.c"
  src.write_text(_C_PRELUDE + _MASKED_HARNESS)
  for isa in ["-march=native"] + (["-mavx2"] if "avx2" in flags else []) + (["-mavx"] if "avx" in flags else []) + [""]:
    exe = tmp_path / "masked"
    r = subprocess.run([cc, "-O2", "-std=gnu11", "-w", *([isa] if isa else []), str(src), "-o", str(exe), "-lm"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (isa, r.stderr[-2000:])
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "bad 0", (isa, out.stdout)
