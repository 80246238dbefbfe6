"""Errors are raised by the op that received bad input, with PyTorch's exception type and a message that
names the shapes, dims or dtypes involved; compiler failures carry the source and the compiler's words.

Each table case runs the same call through torch and through fusegrad: fusegrad must raise the type torch
raises (or a subclass of it), before any kernel runs.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import fusegrad as fg
from conftest import DEVICES
from fusegrad import config, dtype as dt
from fusegrad.runtime import cpu, device as rd


def _pad(m, x, p): return F.pad(x, p) if m is torch else x.pad(p)




# (id, call taking the module (torch or fusegrad), regex the fusegrad message must match)
CASES = [
  ("broadcast", lambda m: m.ones(2, 3) + m.ones(4, 3),
   r"size of tensor a \(2\) must match the size of tensor b \(4\) at non-singleton dimension 0"),
  ("broadcast_3d", lambda m: m.ones(5, 1, 3) * m.ones(2, 4),
   r"size of tensor a \(3\) must match the size of tensor b \(4\) at non-singleton dimension 2"),
  ("where_broadcast", lambda m: m.where(m.ones(2, 3) > 0, m.ones(4, 3), m.ones(2, 3)),
   r"must match the size of tensor b \(4\) at non-singleton dimension 0"),
  ("inplace_broadcast", lambda m: m.ones(2, 3).add_(m.ones(4, 2, 3)),
   r"output with shape \[2, 3\] doesn't match the broadcast shape \[4, 2, 3\]"),
  ("sum_bad_axis", lambda m: m.ones(2, 3).sum(2), r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
  ("sum_bad_neg_axis", lambda m: m.ones(2, 3).sum(-3, keepdim=True), r"Dimension out of range .*\[-2, 1\].* got -3"),
  ("max_bad_axis", lambda m: m.ones(2, 3).max(5), r"Dimension out of range .*got 5"),
  ("argmax_bad_axis", lambda m: m.ones(2, 3).argmax(2), r"Dimension out of range .*got 2"),
  ("softmax_bad_axis", lambda m: m.ones(2, 3).softmax(3), r"Dimension out of range .*got 3"),
  ("transpose_bad_axis", lambda m: m.ones(2, 3).transpose(0, 2), r"Dimension out of range .*got 2"),
  ("unsqueeze_bad_axis", lambda m: m.ones(2, 3).unsqueeze(4), r"Dimension out of range .*\[-3, 2\].*got 4"),
  ("flip_bad_axis", lambda m: m.ones(2, 3).flip(3), r"Dimension out of range .*got 3"),
  ("cat_bad_axis", lambda m: m.cat([m.ones(2, 3), m.ones(2, 3)], 2), r"Dimension out of range .*got 2"),
  ("dup_dims", lambda m: m.ones(2, 3).sum((0, 0)), r"appears multiple times"),
  ("reshape_wrong_size", lambda m: m.ones(2, 3).reshape(4, 2), r"shape '\[4, 2\]' is invalid for input of size 6"),
  ("reshape_infer_wrong_size", lambda m: m.ones(2, 3).reshape(-1, 4), r"shape '\[-1, 4\]' is invalid for input of size 6"),
  ("reshape_two_inferred", lambda m: m.ones(2, 3).reshape(2, -1, -1), r"only one dimension can be inferred"),
  ("expand_mismatch", lambda m: m.ones(2, 3).expand(4, 3),
   r"expanded size of the tensor \(4\) must match the existing size \(2\) at non-singleton dimension 0"),
  ("permute_wrong_len", lambda m: m.ones(2, 3).permute(0), r"input.dim\(\) = 2 is not equal to len\(dims\) = 1"),
  ("matmul_inner", lambda m: m.ones(2, 3) @ m.ones(4, 5), r"cannot be multiplied \(2x3 and 4x5\)"),
  ("matmul_vec_inner", lambda m: m.ones(3) @ m.ones(4), r"\b3\b.*\b4\b"),
  ("bmm_inner", lambda m: m.ones(2, 2, 3) @ m.ones(2, 4, 5), r"2x2x3.*2x4x5"),
  ("matmul_batch_broadcast", lambda m: m.ones(2, 3, 4) @ m.ones(3, 4, 5), r"\(2\).*\(3\)"),
  ("matmul_0d", lambda m: m.ones(()) @ m.ones(3), r"at least 1D, but they are 0D and 1D"),
  ("index_out_of_range", lambda m: m.ones(2, 3)[5], r"index 5 is out of bounds for dimension 0 with size 2"),
  ("index_out_of_range_dim1", lambda m: m.ones(2, 3)[0, 3], r"index 3 is out of bounds for dimension 1 with size 3"),
  ("index_negative_out_of_range", lambda m: m.ones(2, 3)[-3], r"index -3 is out of bounds for dimension 0 with size 2"),
  ("tensor_index_out_of_range", lambda m: m.ones(2, 3)[m.tensor([0, 5])], r"index 5 is out of bounds for dimension 0 with size 2"),
  ("too_many_indices", lambda m: m.ones(2, 3)[0, 0, 0], r"too many indices for tensor of dimension 2"),
  ("too_many_indices_slices", lambda m: m.ones(2, 3)[:, :, :1], r"too many indices for tensor of dimension 2"),
  ("float_tensor_index", lambda m: m.ones(2, 3)[m.tensor([0.0])], r"tensors used as indices must be long, int, byte or bool"),
  ("mask_shape", lambda m: m.ones(2, 3)[m.tensor([True, False, True])], r"shape of the mask \[3\] .* indexed tensor \[2, 3\]"),
  ("item_many", lambda m: m.ones(2, 3).item(), r"a Tensor with 6 elements cannot be converted to Scalar"),
  ("item_empty", lambda m: m.ones(0).item(), r"a Tensor with 0 elements cannot be converted to Scalar"),
  ("bool_of_many", lambda m: bool(m.ones(2, 3)), r"6 values is ambiguous"),
  ("bitwise_not_float", lambda m: ~m.ones(2, 3), r"float32"),
  pytest.param("bitwise_and_float", lambda m: m.ones(2, 3) & m.ones(2, 3), r"float32"),
  pytest.param("bitwise_xor_float_scalar", lambda m: m.ones(2, 3) ^ 1, r"float32"),
  pytest.param("lshift_float", lambda m: m.ones(2) << 1, r"float32"),
  ("cat_mismatched_shapes", lambda m: m.cat([m.ones(2, 3), m.ones(2, 4)], 0),
   r"Sizes of tensors must match except in dimension 0.*\b3\b.*\b4\b.*tensor number 1"),
  pytest.param("cat_mismatched_ndim", lambda m: m.cat([m.ones(2, 3), m.ones(2)], 0),
               r"same number of dimensions.*\b2\b.*\b1\b"),
  ("stack_different_shapes", lambda m: m.stack([m.ones(2, 3), m.ones(3, 2)]),
   r"stack expects each tensor to be equal size, but got \[2, 3\] at entry 0 and \[3, 2\] at entry 1"),
  pytest.param("pad_odd_length", lambda m: _pad(m, m.ones(2, 3), (1, 2, 3)), r"divisible by 2"),
  pytest.param("pad_too_long", lambda m: _pad(m, m.ones(2, 3), (1, 1, 1, 1, 1, 1)), r"\b6\b.*\b2\b|\b2\b.*\b6\b"),
  ("pad_negative_size", lambda m: _pad(m, m.ones(2, 3), (-2, -2)), r"negative"),
  ("narrow_out_of_range", lambda m: m.ones(2, 3).narrow(1, 2, 5), r"start \(2\) \+ length \(5\) exceeds dimension size \(3\)"),
  ("max_of_empty", lambda m: m.ones(0).max(), r"numel\(\) == 0"),
  ("ragged_data", lambda m: m.tensor([[1, 2], [3]]), r"length 2.*dim 1|inhomogeneous"),
  ("split_sizes_sum", lambda m: m.ones(4, 3).split([1, 2], 0), r"sum exactly to 4 .* split_sizes=\[1, 2\]"),
  ("arange_zero_step", lambda m: m.arange(0, 5, 0), r"step must be nonzero"),
  ("mean_of_int", lambda m: m.ones(2, dtype=m.int64).mean(), r"could not infer output dtype"),
  ("negate_bool", lambda m: -m.ones(2, dtype=m.bool), r"Negation, the `-` operator, on a bool tensor"),
  ("unknown_device", lambda m: m.ones(2, device="nosuchdev"), r"nosuchdev"),
  ("slice_step_zero", lambda m: m.ones(4)[::0], r"slice step cannot be zero"),
  ("tril_1d", lambda m: m.ones(3).tril(), r"at least 2 dimensions"),
  ("chunk_zero", lambda m: m.ones(2).chunk(0), r"greater than 0"),
]


def _with_ids(cases):
  out = []
  for c in cases:
    values, marks = (c.values, c.marks) if hasattr(c, "marks") else (c, ())
    out.append(pytest.param(*values, marks=marks, id=values[0]))
  return out


@pytest.mark.parametrize("name,call,pattern", _with_ids(CASES))
def test_error_matches_torch(name, call, pattern):
  with pytest.raises(Exception) as tinfo:
    call(torch)
  expected = type(tinfo.value)
  with fg.track() as t:
    with pytest.raises(expected, match=pattern) as finfo:
      call(fg)
  assert t.kernels == [], f"{name}: a kernel ran before the error"   # raised at the op, not at realize


def test_mixed_devices_raise_at_the_op():
  a, b = fg.ones(2, device="CPU"), fg.ones(2, device="PYTHON")
  for f in (lambda: a + b, lambda: fg.cat([a, b]), lambda: fg.where(a > 0, a, b)):
    with pytest.raises(RuntimeError, match=r"(CPU.*PYTHON|PYTHON.*CPU)"):
      f()


def test_canonical_device_names_accepted():
  for name in ("cpu", "CPU", "cpu:0", "python"):
    assert fg.ones(2, device=name).device in ("CPU", "PYTHON")
  with pytest.raises(RuntimeError, match=r"unknown device 'gpu9'.*CPU"):
    fg.zeros(3, device="gpu9")


# ---- dtypes a device cannot run ----------------------------------------------------------------------

DTYPE_DEVICES = [d for d in DEVICES if d != "CPU"]


@pytest.fixture(params=DTYPE_DEVICES)
def no_fp64_device(request, monkeypatch) -> str:
  """A device without float64: the real one where it lacks it, else one whose `supported` excludes it."""
  dev = rd.get(request.param)
  if dt.float64 in dev.supported:
    monkeypatch.setattr(dev, "supported", frozenset(d for d in dev.supported if d != dt.float64))
  return request.param


@pytest.mark.parametrize("call", [
  lambda d: fg.ones(3, dtype=fg.float64, device=d),
  lambda d: fg.tensor(np.ones(3), device=d),                       # a numpy float64 array keeps its dtype
  lambda d: fg.tensor([1.0, 2.0], dtype=fg.float64, device=d),
  lambda d: fg.ones(3, dtype=fg.float64).to(d),
  lambda d: fg.ones(3, device=d).double(),
  lambda d: fg.ones(3, device=d).to(fg.float64),
  lambda d: fg.rand(3, device=d, dtype=fg.float64),
  lambda d: fg.eye(3, device=d, dtype=fg.float64),
  lambda d: fg.arange(4, device=d, dtype=fg.float64),
], ids=["ones", "tensor_np", "tensor_list", "to_device", "double", "to_dtype", "rand", "eye", "arange"])
def test_unsupported_dtype_raises_at_the_op(no_fp64_device, call):
  with fg.track() as t:
    with pytest.raises(RuntimeError, match=rf"{no_fp64_device}.*float64"):
      call(no_fp64_device)
  assert t.kernels == []


def test_supported_dtypes_still_run_without_fp64(no_fp64_device):
  d = no_fp64_device
  x = fg.tensor([1.0, 2.0, 4.0], device=d)
  assert x.dtype == fg.float32
  np.testing.assert_allclose((x.sqrt() / 2).numpy(), np.sqrt([1.0, 2.0, 4.0]) / 2, rtol=1e-6)
  np.testing.assert_allclose(fg.linspace(0, 1, 5, device=d).numpy(), np.linspace(0, 1, 5), rtol=1e-6)
  np.testing.assert_array_equal((fg.arange(5, device=d) // 2).numpy(), np.arange(5) // 2)


def test_randint_without_fp64(no_fp64_device):
  r = fg.randint(0, 10, (1000,), device=no_fp64_device).numpy()
  assert r.dtype == np.int64 and r.min() >= 0 and r.max() <= 9 and len(np.unique(r)) == 10


def test_integer_pow_without_fp64(no_fp64_device):
  a = fg.arange(6, device=no_fp64_device)
  np.testing.assert_array_equal((a ** a).numpy(), np.arange(6) ** np.arange(6))


# ---- compiler failures -----------------------------------------------------------------------------------

def test_failed_c_compile_raises_compile_error_with_source_and_message():
  dev = rd.get("CPU")
  before = dev.compiles
  for _ in range(2):    # a failure is not cached: the second call compiles (and fails) again
    with pytest.raises(fg.CompileError) as info:
      dev.compile("k", "this is not C")
    msg = str(info.value)
    assert "this is not C" in msg                      # the source
    assert "error" in msg and "this" in msg.split("--- source ---")[0]   # the compiler's own words
  assert isinstance(info.value, RuntimeError)
  assert dev.compiles == before + 2


@pytest.mark.skipif("OPENCL" not in DTYPE_DEVICES, reason="no OpenCL device")
def test_failed_opencl_compile_raises_compile_error_with_source_and_message():
  with pytest.raises(fg.CompileError) as info:
    rd.get("OPENCL").compile("k", "this is not OpenCL C")
  msg = str(info.value)
  assert "this is not OpenCL C" in msg and "error" in msg.split("--- source ---")[0]


@pytest.fixture
def no_compiler(monkeypatch):
  monkeypatch.setattr(rd.get("CPU"), "programs", {})    # nothing compiled earlier may be reused
  cpu.find_compiler.cache_clear()
  yield monkeypatch
  cpu.find_compiler.cache_clear()   # monkeypatch restores PATH and config next; the compiler is found afresh


@pytest.mark.parametrize("cc", ["", "no-such-compiler-fg"])
def test_missing_c_compiler_is_a_clear_error(no_compiler, tmp_path, cc):
  no_compiler.setattr(config, "CC", cc)
  no_compiler.setenv("PATH", str(tmp_path))           # an empty directory: no clang, gcc or cc
  x = fg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  y = (x * 3.25 + 1).exp2()                          # building the graph needs no compiler
  with pytest.raises(RuntimeError, match=r"C compiler") as info:
    y.numpy()
  msg = str(info.value)
  assert "FUSEGRAD_CC" in msg and (cc in msg if cc else "gcc" in msg and "clang" in msg)
