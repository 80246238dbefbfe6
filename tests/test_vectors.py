"""Vector values (codegen/passes.vector_axis, ir.VecDType): an UPCAST axis of a vector width becomes vector loads,
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
W = {"CPU": 16, "OPENCL": 8}      # the widest vector of each renderer (renderer caps)


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
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-2)


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
  got, want = _run(fg.maximum(t, u), (Opt(OptOp.UPCAST, 1, W[dev]),), dev, W[dev])
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, np.maximum(x, y))


@pytest.mark.parametrize("dev", DEVICES)
def test_elementwise_arithmetic(dev, rng):
  a, b, c = _t(rng, dev, 8, 64), _t(rng, dev, 8, 64), _t(rng, dev, 8, 64)
  out = -(a * 2 + b) / (c.abs() + 1) - fg.minimum(a, b)
  # abs is not a vector op: the kernel stays scalar (and right)
  got, want = _run(out, (Opt(OptOp.UPCAST, 1, 8),), dev, None)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  out = -(a * 2 + b) / (c * c + 1) - fg.minimum(a, b)
  got, want = _run(out, (Opt(OptOp.UPCAST, 1, 8),), dev, 8)
  # a compiler may contract c * c + 1 into one fused multiply-add (C and OpenCL allow it): an ulp, then cancellation
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_strided_and_padded_loads_and_strided_stores(dev, rng):
  a, b = _t(rng, dev, 32, 48), _t(rng, dev, 48, 32)
  # a transposed operand: its lanes are one load each
  got, want = _run(a + b.T, (Opt(OptOp.UPCAST, 1, W[dev]),), dev, W[dev])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # the vector axis across rows: loads and stores a row apart
  got, want = _run(a * 3 - a, (Opt(OptOp.UPCAST, 0, W[dev]),), dev, W[dev])
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # padding: lanes past the edge read 0, each under its own condition
  p = fg.nn.functional.pad(a, (3, 5, 0, 0)) * 2
  got, want = _run(p, (Opt(OptOp.UPCAST, 1, 8),), dev, 8)
  np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dev", DEVICES)
def test_other_dtypes_stay_scalar(dev, rng):
  x = fg.Tensor(rng.integers(-50, 50, (4, 64)).astype(np.int32), device=dev)
  got, want = _run(x.sum(1), (Opt(OptOp.UPCAST, 1, 8),), dev, None)
  np.testing.assert_array_equal(got, want)
  h = fg.Tensor(rng.standard_normal((4, 64)).astype(np.float16), device=dev)
  got, want = _run(h * 2 + 1, (Opt(OptOp.UPCAST, 1, 8),), dev, None)
  np.testing.assert_array_equal(got, want)


def test_heuristic_vectorizes_elementwise_and_big_matmul_packs(rng):
  """CPU defaults: an elementwise kernel of vector ops runs in vectors; a large float32 matmul reads its right
  operand from panels (one extra copy kernel) and still matches numpy."""
  a, b = _t(rng, "CPU", 64, 256), _t(rng, "CPU", 64, 256)
  item = one_kernel(a * b + a)
  opts = heuristic.hand_coded(item.kernel, rd.get("CPU").caps)
  assert [o.op for o in opts] == [OptOp.UPCAST] and opts[0].arg == 16
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
  assert "fg_vexp_" in rd.get(device).compile_with(item.kernel, opts).source or device != "CPU"
  np.testing.assert_array_equal(vec.view(np.uint32), run(item, (), device).view(np.uint32))
  with np.errstate(over="ignore"):
    ref = np.exp(v.astype(np.float64))
  fin = np.isfinite(ref) & (ref < 3e38)
  np.testing.assert_allclose(vec[fin], ref[fin], rtol=2.5e-7, atol=1e-37)
