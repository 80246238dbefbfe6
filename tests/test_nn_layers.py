"""fusegrad.nn layers against torch.nn, with the same weights, on fresh random inputs.

Each case builds one layer with the same constructor call in both libraries (`L` is `fusegrad.nn` or
`torch.nn`), gives ours random parameters, copies them into torch's through `load_state_dict`, and
compares the output, the input gradients and every parameter gradient (torch in float64, ours in float32).
The whole table runs on CPU; the cases marked ALL also run on PYTHON and OPENCL.
"""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as fnn
from conftest import DEVICES

RTOL, ATOL = 1e-5, 1e-5
OTHER = [d for d in DEVICES if d != "CPU"]


# ---- helpers ----------------------------------------------------------------------------------------------------

def draw(rng, shape, dom: str = "real") -> np.ndarray:
  """float32 inputs: real N(0, 1); relu (a relu'd normal: ~half exact zeros, ties for max); ties (small ints);
  kinks (the breakpoints of the piecewise activations, then uniform (-7, 7))"""
  if dom == "real": return rng.standard_normal(shape).astype(np.float32)
  if dom == "relu": return np.maximum(rng.standard_normal(shape), 0).astype(np.float32)
  if dom == "ties": return rng.integers(-2, 3, size=shape).astype(np.float32)
  if dom == "kinks":
    a = rng.uniform(-7, 7, size=shape).astype(np.float32)
    k = (0.0, -1.0, 1.0, -3.0, 3.0, 6.0, -6.0, 2.0, -2.0, 0.5)
    a.reshape(-1)[:min(a.size, len(k))] = k[:min(a.size, len(k))]
    return a
  raise ValueError(dom)


def close(got, want, label: str, tol: float = 1.0) -> None:
  """got: a fusegrad tensor (or numpy array), want: a torch tensor or numpy array (float64 reference)"""
  assert got is not None, f"{label}: is None, torch has a value"
  g = got.numpy() if isinstance(got, fg.Tensor) else np.asarray(got)
  w = want.detach().double().numpy() if isinstance(want, torch.Tensor) else np.asarray(want, np.float64)
  assert g.shape == w.shape, f"{label}: shape {g.shape}, torch {w.shape}"
  scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
  np.testing.assert_allclose(g, w, rtol=RTOL * tol, atol=ATOL * tol * scale, err_msg=label)


def randomize(m: fnn.Module, rng, device) -> None:
  """random floating parameters and buffers (running_var stays positive) through load_state_dict"""
  sd = {}
  for k, v in m.state_dict().items():
    if v.dtype.is_float:
      a = rng.uniform(0.5, 2.0, v.shape) if k.endswith("running_var") else rng.uniform(-1, 1, v.shape)
      sd[k] = fg.tensor(a.astype(np.float32), device=device)
    else: sd[k] = v
  m.load_state_dict(sd)


def twin(ours: fnn.Module, build) -> torch.nn.Module:
  """torch's layer from the same constructor call, with our weights, in float64"""
  theirs = build(torch.nn)
  theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
  return theirs.double().train(ours.training)


def as_list(y) -> list: return list(y) if isinstance(y, tuple) else [y]


def check_module(ours, theirs, fx: list, tx: list, rng, tol: float = 1.0, fkw=None, tkw=None) -> None:
  """forward, then backward of sum(out * g) with random g, comparing outputs, input and parameter grads"""
  fys, tys = as_list(ours(*fx, **(fkw or {}))), as_list(theirs(*tx, **(tkw or {})))
  assert len(fys) == len(tys)
  floss, tloss = None, None
  for i, (fy, ty) in enumerate(zip(fys, tys)):
    if ty is None:
      assert fy is None, f"output {i}: torch returns None"
      continue
    if not ty.is_floating_point():       # indices
      assert not fy.dtype.is_float, f"output {i}: dtype {fy.dtype.name}, torch {ty.dtype}"
      np.testing.assert_array_equal(fy.numpy(), ty.numpy(), err_msg=f"output {i}")
      continue
    assert fy.dtype == fg.float32, f"output {i}: dtype {fy.dtype.name}"
    close(fy, ty, f"output {i}", tol)
    g = rng.standard_normal(ty.shape).astype(np.float32)
    fl = (fy * fg.tensor(g, device=fy.device)).sum()
    tl = (ty * torch.tensor(g, dtype=torch.float64)).sum()
    floss, tloss = (fl, tl) if floss is None else (floss + fl, tloss + tl)
  floss.backward()
  tloss.backward()
  for i, (a, b) in enumerate(zip(fx, tx)):
    if b.requires_grad:
      assert a.grad is not None and a.grad.shape == a.shape, f"input {i} grad"
      close(a.grad, b.grad, f"input {i} grad", tol)
  tparams = dict(theirs.named_parameters())
  fparams = dict(ours.named_parameters())
  assert list(fparams) == list(tparams), "parameter names"
  for k, p in fparams.items():
    if tparams[k].grad is None:
      assert p.grad is None or not np.any(p.grad.numpy()), f"{k}: torch has no grad"
      continue
    assert p.grad is not None, f"{k}: .grad is None"
    assert p.grad.shape == p.shape and p.grad.device == p.device, k
    close(p.grad, tparams[k].grad, f"grad of {k}", tol)


# ---- the table ------------------------------------------------------------------------------------------------

class Case:
  def __init__(self, name, build, shape, dom="real", all_devices=False, tol=1.0, train=True):
    self.name, self.build, self.shape, self.dom, self.all, self.tol, self.train = (name, build, shape, dom, all_devices,
                                                                                    tol, train)


PAD_MODES = ("reflect", "replicate", "circular")
CASES = [
  # linear
  Case("linear", lambda L: L.Linear(5, 3), (4, 5), all_devices=True),
  Case("linear_nobias_3d", lambda L: L.Linear(5, 3, bias=False), (2, 3, 5)),
  Case("linear_unbatched", lambda L: L.Linear(6, 4), (6,)),
  # conv1d
  Case("conv1d", lambda L: L.Conv1d(3, 4, 3), (2, 3, 9), all_devices=True),
  Case("conv1d_stride_pad_dil_groups", lambda L: L.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2),
       (2, 4, 11)),
  Case("conv1d_same_even_kernel", lambda L: L.Conv1d(3, 4, 4, padding="same"), (2, 3, 8)),
  Case("conv1d_same_dilated", lambda L: L.Conv1d(3, 2, 3, padding="same", dilation=3), (2, 3, 8)),
  Case("conv1d_valid_nobias", lambda L: L.Conv1d(3, 4, 3, padding="valid", bias=False), (2, 3, 7)),
  Case("conv1d_unbatched", lambda L: L.Conv1d(3, 4, 3, padding=1), (3, 7)),
  *[Case(f"conv1d_{m}", (lambda m: lambda L: L.Conv1d(3, 4, 3, padding=2, padding_mode=m))(m), (2, 3, 7))
    for m in PAD_MODES],
  # conv2d
  Case("conv2d", lambda L: L.Conv2d(3, 4, 3), (2, 3, 6, 6), all_devices=True),
  Case("conv2d_rect_stride_pad", lambda L: L.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 2)), (2, 3, 7, 6)),
  Case("conv2d_dil_groups_nobias", lambda L: L.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2, bias=False),
       (2, 4, 7, 6), all_devices=True),
  Case("conv2d_depthwise", lambda L: L.Conv2d(4, 8, 3, groups=4, padding=1), (2, 4, 5, 5)),
  Case("conv2d_same", lambda L: L.Conv2d(3, 4, (4, 3), padding="same", dilation=(1, 2)), (2, 3, 6, 7)),
  Case("conv2d_valid_stride", lambda L: L.Conv2d(3, 2, 2, stride=3, padding="valid"), (1, 3, 8, 7)),
  Case("conv2d_unbatched", lambda L: L.Conv2d(3, 4, 3, padding=1), (3, 5, 5)),
  *[Case(f"conv2d_{m}", (lambda m: lambda L: L.Conv2d(3, 4, 3, stride=2, padding=(1, 2), padding_mode=m))(m),
         (2, 3, 6, 7), all_devices=m == "reflect") for m in PAD_MODES],
  Case("conv2d_same_circular", lambda L: L.Conv2d(2, 3, (2, 3), padding="same", padding_mode="circular"), (2, 2, 5, 5)),
  # transposed convolutions
  Case("conv_transpose1d", lambda L: L.ConvTranspose1d(3, 4, 3), (2, 3, 5), all_devices=True),
  Case("conv_transpose1d_all", lambda L: L.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
       (2, 4, 5)),
  Case("conv_transpose1d_dil", lambda L: L.ConvTranspose1d(3, 2, 4, stride=3, padding=2, output_padding=2, dilation=2,
                                                           bias=False), (2, 3, 4)),
  Case("conv_transpose1d_unbatched", lambda L: L.ConvTranspose1d(3, 2, 3, stride=2), (3, 4)),
  Case("conv_transpose2d", lambda L: L.ConvTranspose2d(3, 4, 3, stride=2), (2, 3, 4, 4), all_devices=True),
  Case("conv_transpose2d_all", lambda L: L.ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(1, 0),
                                                           output_padding=(1, 2), groups=2, dilation=(2, 1)),
       (2, 4, 3, 4)),
  Case("conv_transpose2d_pad_nobias", lambda L: L.ConvTranspose2d(2, 3, 3, padding=1, bias=False), (1, 2, 5, 4)),
  # max pooling; 'relu' and 'ties' inputs have many equal maxima: torch sends the gradient to one of them
  Case("maxpool1d", lambda L: L.MaxPool1d(3), (2, 3, 10), all_devices=True),
  Case("maxpool1d_all", lambda L: L.MaxPool1d(3, stride=2, padding=1, dilation=2, ceil_mode=True), (2, 3, 10)),
  Case("maxpool1d_ties", lambda L: L.MaxPool1d(4, stride=2, padding=2), (2, 3, 11), dom="relu"),
  Case("maxpool1d_indices", lambda L: L.MaxPool1d(3, stride=2, padding=1, return_indices=True), (2, 3, 9), dom="ties"),
  Case("maxpool1d_unbatched", lambda L: L.MaxPool1d(2), (3, 8)),
  Case("maxpool2d", lambda L: L.MaxPool2d(2), (2, 3, 6, 6), all_devices=True),
  Case("maxpool2d_stride_pad", lambda L: L.MaxPool2d(3, stride=2, padding=1), (2, 3, 7, 6)),
  Case("maxpool2d_dil_ceil", lambda L: L.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True), (2, 2, 8, 9)),
  Case("maxpool2d_ceil", lambda L: L.MaxPool2d(2, ceil_mode=True), (1, 2, 5, 7)),
  Case("maxpool2d_ceil_stride3", lambda L: L.MaxPool2d(3, stride=3, padding=1, ceil_mode=True), (1, 2, 7, 8)),
  Case("maxpool2d_ties_relu", lambda L: L.MaxPool2d(3, stride=1, padding=1), (2, 3, 6, 6), dom="relu",
       all_devices=True),
  Case("maxpool2d_ties_ints", lambda L: L.MaxPool2d((2, 3), stride=(1, 2)), (2, 2, 5, 7), dom="ties"),
  Case("maxpool2d_indices", lambda L: L.MaxPool2d(3, stride=2, padding=1, return_indices=True), (2, 3, 7, 6),
       dom="ties", all_devices=True),
  Case("maxpool2d_indices_dil_ceil", lambda L: L.MaxPool2d(2, stride=2, dilation=2, ceil_mode=True,
                                                           return_indices=True), (1, 2, 7, 8)),
  Case("maxpool2d_unbatched_indices", lambda L: L.MaxPool2d(2, return_indices=True), (3, 4, 6)),
  # average pooling
  Case("avgpool1d", lambda L: L.AvgPool1d(3), (2, 3, 10), all_devices=True),
  Case("avgpool1d_pad_exclude", lambda L: L.AvgPool1d(3, stride=2, padding=1, count_include_pad=False), (2, 3, 10)),
  Case("avgpool1d_ceil", lambda L: L.AvgPool1d(4, stride=3, padding=2, ceil_mode=True), (2, 3, 10)),
  Case("avgpool1d_ceil_exclude", lambda L: L.AvgPool1d(3, stride=2, padding=1, ceil_mode=True,
                                                       count_include_pad=False), (2, 3, 8)),
  Case("avgpool2d", lambda L: L.AvgPool2d(2), (2, 3, 6, 6), all_devices=True),
  Case("avgpool2d_pad_exclude", lambda L: L.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (2, 3, 7, 6),
       all_devices=True),
  Case("avgpool2d_ceil", lambda L: L.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 6, 8)),
  Case("avgpool2d_ceil_exclude", lambda L: L.AvgPool2d((2, 3), stride=2, padding=1, ceil_mode=True,
                                                       count_include_pad=False), (1, 2, 6, 8)),
  Case("avgpool2d_divisor", lambda L: L.AvgPool2d(3, stride=2, divisor_override=5), (2, 3, 7, 7)),
  Case("avgpool2d_divisor_pad_ceil", lambda L: L.AvgPool2d(2, stride=2, padding=1, ceil_mode=True,
                                                           divisor_override=3), (1, 2, 5, 6)),
  Case("avgpool2d_unbatched", lambda L: L.AvgPool2d(2, padding=1), (3, 4, 5)),
  # adaptive average pooling
  Case("adaptive_avgpool1d_divisible", lambda L: L.AdaptiveAvgPool1d(4), (2, 3, 8), all_devices=True),
  Case("adaptive_avgpool1d_uneven", lambda L: L.AdaptiveAvgPool1d(3), (2, 3, 8), all_devices=True),
  Case("adaptive_avgpool1d_upsample", lambda L: L.AdaptiveAvgPool1d(10), (2, 3, 7)),
  Case("adaptive_avgpool2d_divisible", lambda L: L.AdaptiveAvgPool2d((2, 3)), (2, 3, 6, 6)),
  Case("adaptive_avgpool2d_uneven", lambda L: L.AdaptiveAvgPool2d((4, 5)), (2, 3, 7, 9), all_devices=True),
  Case("adaptive_avgpool2d_none", lambda L: L.AdaptiveAvgPool2d((None, 3)), (2, 3, 5, 7)),
  Case("adaptive_avgpool2d_global", lambda L: L.AdaptiveAvgPool2d(1), (2, 3, 5, 4)),
  Case("adaptive_avgpool2d_unbatched", lambda L: L.AdaptiveAvgPool2d(3), (3, 5, 7)),
  # normalization
  Case("layernorm", lambda L: L.LayerNorm(8), (3, 4, 8), all_devices=True),
  Case("layernorm_2d_shape", lambda L: L.LayerNorm((4, 8), eps=1e-3), (3, 4, 8)),
  Case("layernorm_no_affine", lambda L: L.LayerNorm(6, elementwise_affine=False), (5, 6)),
  Case("layernorm_no_bias", lambda L: L.LayerNorm(6, bias=False), (2, 5, 6)),
  Case("rmsnorm", lambda L: L.RMSNorm(8), (3, 4, 8), all_devices=True),
  Case("rmsnorm_2d_eps", lambda L: L.RMSNorm((4, 8), eps=1e-3), (3, 4, 8)),
  Case("rmsnorm_no_affine", lambda L: L.RMSNorm(6, elementwise_affine=False), (5, 6)),
  Case("groupnorm", lambda L: L.GroupNorm(2, 6), (2, 6, 4, 4), all_devices=True),
  Case("groupnorm_no_affine_3d", lambda L: L.GroupNorm(3, 6, affine=False), (2, 6, 5)),
  Case("groupnorm_one_group_2d", lambda L: L.GroupNorm(1, 4, eps=1e-3), (3, 4)),
  Case("groupnorm_instance", lambda L: L.GroupNorm(6, 6), (2, 6, 3, 3)),
  Case("groupnorm_no_bias", lambda L: L.GroupNorm(2, 4, bias=False), (2, 4, 3)),
  # activations: 'kinks' puts inputs exactly on every breakpoint
  Case("relu", lambda L: L.ReLU(), (4, 5), dom="kinks", all_devices=True),
  Case("relu6", lambda L: L.ReLU6(), (4, 5), dom="kinks"),
  Case("leaky_relu", lambda L: L.LeakyReLU(0.2), (4, 5), dom="kinks"),
  Case("leaky_relu_default", lambda L: L.LeakyReLU(), (4, 5), dom="kinks"),
  Case("elu", lambda L: L.ELU(0.5), (4, 5), dom="kinks"),
  Case("gelu", lambda L: L.GELU(), (4, 5), dom="kinks", all_devices=True),
  Case("gelu_tanh", lambda L: L.GELU(approximate="tanh"), (4, 5), dom="kinks"),
  Case("silu", lambda L: L.SiLU(), (4, 5), dom="kinks"),
  Case("mish", lambda L: L.Mish(), (4, 5), dom="kinks"),
  Case("softplus", lambda L: L.Softplus(), (4, 5), dom="kinks"),
  Case("softplus_beta_threshold", lambda L: L.Softplus(beta=2.0, threshold=3.0), (4, 5), dom="kinks"),
  Case("sigmoid", lambda L: L.Sigmoid(), (4, 5), dom="kinks"),
  Case("tanh", lambda L: L.Tanh(), (4, 5), dom="kinks"),
  Case("hardtanh", lambda L: L.Hardtanh(), (4, 5), dom="kinks"),
  Case("hardtanh_bounds", lambda L: L.Hardtanh(-2.0, 3.0), (4, 5), dom="kinks"),
  Case("hardsigmoid", lambda L: L.Hardsigmoid(), (4, 5), dom="kinks", all_devices=True),
  Case("hardswish", lambda L: L.Hardswish(), (4, 5), dom="kinks"),
  Case("logsigmoid", lambda L: L.LogSigmoid(), (4, 5), dom="kinks"),
  Case("softmax", lambda L: L.Softmax(dim=1), (3, 4, 5)),
  Case("softmax_dim0", lambda L: L.Softmax(0), (3, 4)),
  Case("log_softmax", lambda L: L.LogSoftmax(dim=-1), (3, 4, 5), all_devices=True),
  # no dim: torch's legacy choice (dim 0 for 0, 1 and 3 dims, else 1)
  Case("softmax_implicit_3d", lambda L: L.Softmax(), (3, 4, 5)),
  Case("softmax_implicit_4d", lambda L: L.Softmax(), (2, 3, 4, 2)),
  Case("log_softmax_implicit_1d", lambda L: L.LogSoftmax(), (5,)),
  Case("log_softmax_implicit_2d", lambda L: L.LogSoftmax(), (3, 5)),
  Case("identity", lambda L: L.Identity(54, unused=3), (3, 4)),
  # reshaping
  Case("flatten", lambda L: L.Flatten(), (2, 3, 4, 2)),
  Case("flatten_range", lambda L: L.Flatten(0, 2), (2, 3, 4, 2)),
  Case("unflatten", lambda L: L.Unflatten(1, (2, 3)), (4, 6, 2)),
  Case("unflatten_neg", lambda L: L.Unflatten(-1, (2, -1)), (4, 6)),
  # containers
  Case("sequential_cnn", lambda L: L.Sequential(L.Conv2d(2, 4, 3, padding=1), L.BatchNorm2d(4), L.ReLU(),
                                                L.MaxPool2d(2), L.Flatten(), L.Linear(36, 5)),
       (3, 2, 6, 6), all_devices=True, tol=2.0),
  Case("sequential_cnn_eval", lambda L: L.Sequential(L.Conv2d(2, 4, 3, padding=1), L.BatchNorm2d(4), L.ReLU(),
                                                     L.AvgPool2d(2), L.Flatten(), L.Linear(36, 5)),
       (3, 2, 6, 6), train=False),
  Case("sequential_mlp", lambda L: L.Sequential(L.Linear(6, 8), L.GELU(), L.LayerNorm(8), L.Dropout(0.0),
                                                L.Linear(8, 3), L.LogSoftmax(-1)), (5, 6)),
]
PARAMS = ([pytest.param(c, "CPU", id=f"{c.name}-CPU") for c in CASES]
          + [pytest.param(c, d, id=f"{c.name}-{d}") for d in OTHER for c in CASES if c.all])


@pytest.mark.filterwarnings("ignore:Implicit dimension choice", "ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("case,device", PARAMS)
def test_layer(case, device, rng):
  ours = case.build(fnn).to(device)
  assert all(p.device == device for p in ours.parameters())
  randomize(ours, rng, device)
  ours.train(case.train)
  theirs = twin(ours, case.build)
  x = draw(rng, case.shape, case.dom)
  fx = fg.tensor(x, device=device, requires_grad=True)
  tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
  check_module(ours, theirs, [fx], [tx], rng, case.tol)


@pytest.mark.parametrize("build,shape,size", [
  (lambda L: L.ConvTranspose1d(3, 2, 3, stride=3, padding=1), (2, 3, 4), [11]),
  (lambda L: L.ConvTranspose2d(2, 4, 3, stride=2, padding=1, dilation=2), (2, 2, 3, 4), [2, 4, 8, 9]),
  (lambda L: L.ConvTranspose2d(2, 3, 2, stride=(3, 2)), (2, 3, 4), [10, 9]),
])
def test_conv_transpose_output_size(build, shape, size, rng):
  ours = build(fnn)
  randomize(ours, rng, "CPU")
  theirs = twin(ours, build)
  x = draw(rng, shape)
  check_module(ours, theirs, [fg.tensor(x, requires_grad=True)], [torch.tensor(x, dtype=torch.float64,
                                                                               requires_grad=True)], rng,
               fkw={"output_size": size}, tkw={"output_size": size})
  bad = [s + 5 for s in size]
  with pytest.raises(ValueError):
    theirs(torch.tensor(x, dtype=torch.float64), output_size=bad)
  with pytest.raises(ValueError):
    ours(fg.tensor(x), output_size=bad)


# ---- batch norm: running statistics over several steps ----------------------------------------------------------

BN = [("BatchNorm1d", (6, 3), {}), ("BatchNorm1d", (4, 3, 5), {"momentum": None}),
      ("BatchNorm2d", (3, 3, 4, 4), {}), ("BatchNorm2d", (2, 3, 3, 5), {"momentum": None, "eps": 1e-3}),
      ("BatchNorm2d", (2, 3, 3, 3), {"momentum": 0.5, "affine": False}),
      ("BatchNorm1d", (5, 4), {"track_running_stats": False}), ("BatchNorm2d", (2, 3, 3, 3), {"bias": False})]
BN_PARAMS = ([pytest.param(*b, "CPU", id=f"{b[0]}-{b[1]}-{b[2]}-CPU") for b in BN]
             + [pytest.param(*BN[i], d, id=f"{BN[i][0]}-{d}") for d in OTHER for i in (1, 2)])


@pytest.mark.parametrize("cls,shape,kw,device", BN_PARAMS)
def test_batchnorm_steps(cls, shape, kw, device, rng):
  build = lambda L: getattr(L, cls)(shape[1], **kw)
  ours = build(fnn).to(device)
  randomize(ours, rng, device)
  theirs = twin(ours, build)
  for step in range(3):
    for p in ours.parameters(): p.grad = None
    theirs.zero_grad()
    x = draw(rng, shape) * 2 + 1
    check_module(ours, theirs, [fg.tensor(x, device=device, requires_grad=True)],
                 [torch.tensor(x, dtype=torch.float64, requires_grad=True)], rng, tol=2.0)
    for name, b in theirs.named_buffers():
      got = getattr(ours, name)
      if name == "num_batches_tracked":
        assert got.dtype == fg.int64 and got.shape == () and got.item() == b.item() == step + 1
      else: close(got, b, f"step {step}: {name}")
  if kw.get("track_running_stats", True) is False:
    assert ours.running_mean is None and dict(ours.named_buffers()) == {}
  # eval: the running statistics normalize, and they do not move
  ours.eval(); theirs.eval()
  before = {k: v.numpy().copy() for k, v in ours.state_dict().items()}
  for p in ours.parameters(): p.grad = None
  theirs.zero_grad()
  x = draw(rng, shape)
  check_module(ours, theirs, [fg.tensor(x, device=device, requires_grad=True)],
               [torch.tensor(x, dtype=torch.float64, requires_grad=True)], rng)
  for k, v in ours.state_dict().items(): np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)


def test_batchnorm_stats_realized_with_the_step(rng):
  """A training step with BatchNorm is one realize: the optimizer's computes the new running statistics with the
  parameters (engine/realize.later), so the next forward has nothing pending; the statistics match torch's."""
  from fusegrad.engine import realize as er
  build = lambda L: L.Sequential(L.Conv2d(2, 4, 3, padding=1), L.BatchNorm2d(4), L.ReLU(), L.Flatten(), L.Linear(64, 3))
  ours = build(fnn)
  randomize(ours, rng, "CPU")
  theirs = twin(ours, build)
  opt = fg.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
  topt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
  from fusegrad.engine import trace
  calls, orig = [], er.realize_nodes      # (what every realize runs, a recording step's too: engine/trace.py)
  er.realize_nodes = lambda n: (calls.append(len(n)), orig(n))[1]
  try:
    for step in range(3):
      x = draw(rng, (5, 2, 4, 4)) * 3 + 2
      opt.zero_grad(); topt.zero_grad()
      ours(fg.tensor(x)).square().sum().backward()
      theirs(torch.tensor(x, dtype=torch.float64)).square().sum().backward()
      calls.clear()
      replays = trace.stats["replays"]
      opt.step(); topt.step()
      # parameters, momenta and statistics in one schedule (or one replayed plan: a step that repeats one seen before)
      assert len(calls) + trace.stats["replays"] - replays == 1, calls
      bn = ours[1]
      for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked):   # nothing left pending (a count may fold)
        assert t.node.realized or t.node.op == "CONST", t.node
      close(bn.running_mean, theirs[1].running_mean, f"step {step}: running_mean")
      close(bn.running_var, theirs[1].running_var, f"step {step}: running_var")
      assert bn.num_batches_tracked.item() == step + 1
  finally:
    er.realize_nodes = orig

def test_batchnorm_errors():
  with pytest.raises(ValueError):
    fnn.BatchNorm2d(3)(fg.zeros(2, 3, 4))       # torch: ValueError, expected 4D input
  with pytest.raises(ValueError):
    fnn.BatchNorm1d(3)(fg.zeros(2, 3, 4, 5))
  with pytest.raises(ValueError):             # one value per channel in training
    fnn.BatchNorm1d(3)(fg.zeros(1, 3))
  with pytest.raises(RuntimeError):           # wrong number of channels
    fnn.BatchNorm2d(3)(fg.zeros(2, 4, 3, 3))


# ---- embedding --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("padding_idx,device", [(None, "CPU"), (0, "CPU"), (-2, "CPU")] + [(3, d) for d in OTHER])
def test_embedding(padding_idx, device, rng):
  build = lambda L: L.Embedding(10, 4, padding_idx=padding_idx)
  ours = build(fnn).to(device)
  if padding_idx is not None:   # the padding row starts at zero, as torch's
    assert not np.any(ours.weight.numpy()[padding_idx])
  randomize(ours, rng, device)
  theirs = twin(ours, build)
  idx = rng.integers(0, 10, size=(3, 5))
  if padding_idx is not None: idx.reshape(-1)[::4] = padding_idx % 10
  idx.reshape(-1)[1:3] = idx.reshape(-1)[0]        # repeated rows: their gradients add up
  fy, ty = ours(fg.tensor(idx, device=device)), theirs(torch.tensor(idx))
  close(fy, ty, "output")
  g = rng.standard_normal(ty.shape).astype(np.float32)
  fy.backward(fg.tensor(g, device=device))
  ty.backward(torch.tensor(g, dtype=torch.float64))
  close(ours.weight.grad, theirs.weight.grad, "weight grad")
  if padding_idx is not None: assert not np.any(ours.weight.grad.numpy()[padding_idx % 10])


def test_embedding_errors():
  e = fnn.Embedding(5, 3)
  with pytest.raises(RuntimeError):
    e(fg.zeros(2, 3))                             # float indices: torch raises RuntimeError
  with pytest.raises(AssertionError):
    fnn.Embedding(5, 3, padding_idx=5)
  with pytest.raises(IndexError):
    torch.nn.Embedding(5, 3)(torch.tensor([5]))
    # fusegrad checks indices that already exist
  with pytest.raises(IndexError):
    e(fg.tensor([1, 5]))
  # torch's positional order: padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, _weight
  w = np.arange(15, dtype=np.float32).reshape(5, 3)
  e = fnn.Embedding(5, 3, 1, None, 2.0, False, False, fg.tensor(w))
  assert e.padding_idx == 1
  np.testing.assert_array_equal(e(fg.tensor([4, 1])).numpy(), w[[4, 1]])


# ---- dropout ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_dropout(device, rng):
  p = 0.3
  x = rng.uniform(1, 2, size=(100, 80)).astype(np.float32)
  m = fnn.Dropout(p)
  fx = fg.tensor(x, device=device, requires_grad=True)
  fg.manual_seed(1234)
  y = m(fx)
  out = y.numpy()
  zero = out == 0
  frac, n = zero.mean(), zero.size
  assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n), frac
  np.testing.assert_allclose(out[~zero], x[~zero] / (1 - p), rtol=1e-6)
  g = rng.standard_normal(x.shape).astype(np.float32)
  y.backward(fg.tensor(g, device=device))
  np.testing.assert_allclose(fx.grad.numpy(), np.where(zero, 0, g / (1 - p)), rtol=1e-6, atol=1e-7)
  # the same seed gives the same mask (on every device: the hash is in the kernel), another seed another one
  fg.manual_seed(1234)
  np.testing.assert_array_equal(m(fx).numpy(), out)
  if device != "CPU":
    fg.manual_seed(1234)
    np.testing.assert_array_equal(fnn.Dropout(p)(fg.tensor(x)).numpy(), out)
  fg.manual_seed(4321)
  assert not np.array_equal(m(fx).numpy() == 0, zero)
  # two calls in a row draw different masks
  assert not np.array_equal(m(fx).numpy() == 0, m(fx).numpy() == 0)
  # eval: identity
  m.eval()
  np.testing.assert_array_equal(m(fx).numpy(), x)
  assert np.all(fnn.Dropout(1.0)(fx).numpy() == 0)
  np.testing.assert_array_equal(fnn.Dropout(0.0)(fx).numpy(), x)


def test_dropout_errors():
  for p in (-0.1, 1.5):
    with pytest.raises(ValueError): torch.nn.Dropout(p)
    with pytest.raises(ValueError): fnn.Dropout(p)


# ---- multi-head attention -----------------------------------------------------------------------------------------

L_, S_, N_, E_, H_ = 4, 5, 2, 8, 2


def _masks(rng, kind: str, N: int, H: int, L: int, S: int):
  """numpy (attn_mask, key_padding_mask) of a kind; every query keeps key 0, so no row is all -inf"""
  am = kpm = None
  if kind in ("bool", "bool3d", "bool_kpm"):
    shp = (N * H, L, S) if kind == "bool3d" else (L, S)
    am = rng.random(shp) < 0.4
    am[..., 0] = False                       # True: not allowed (MultiheadAttention's convention)
  if kind in ("float", "float_kpm"):
    am = rng.standard_normal((L, S)).astype(np.float32)
  if kind in ("kpm", "bool_kpm", "float_kpm"):
    kpm = rng.random((N, S)) < 0.4
    kpm[:, 0] = False
  if kind == "causal":
    am = np.triu(np.ones((L, S), bool), 1)
  if kind == "kpm_float":
    kpm = rng.standard_normal((N, S)).astype(np.float32)
  return am, kpm


MHA = [
  # (batch_first, mask kind, need_weights, average_attn_weights, kdim/vdim, unbatched, bias)
  (False, None, True, True, None, False, True),
  (True, None, True, False, None, False, True),
  (True, "bool", True, True, None, False, True),
  (False, "bool3d", True, False, None, False, True),
  (True, "float", False, True, None, False, True),
  (False, "kpm", True, True, None, False, True),
  (True, "bool_kpm", True, False, None, False, False),
  (True, "float_kpm", True, True, None, False, True),
  (True, "kpm_float", True, True, None, False, True),
  (True, "causal", True, True, None, False, True),
  (False, None, True, True, (6, 3), False, True),
  (True, "bool", False, True, (6, 3), False, True),
  (False, None, True, True, None, True, True),
  (True, "bool", True, False, None, True, True),
]
MHA_PARAMS = ([pytest.param(*c, "CPU", id="-".join(map(str, c)) + "-CPU") for c in MHA]
              + [pytest.param(*MHA[i], d, id=f"mha{i}-{d}") for d in OTHER for i in (2, 10)])


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("batch_first,mask,need_weights,avg,kvdim,unbatched,bias,device", MHA_PARAMS)
def test_multihead_attention(batch_first, mask, need_weights, avg, kvdim, unbatched, bias, device, rng):
  kd, vd = kvdim or (None, None)
  build = lambda L: L.MultiheadAttention(E_, H_, bias=bias, kdim=kd, vdim=vd, batch_first=batch_first)
  ours = build(fnn).to(device)
  randomize(ours, rng, device)
  theirs = twin(ours, build)
  N = 1 if unbatched else N_
  def shape(n, e):
    if unbatched: return (n, e)
    return (N, n, e) if batch_first else (n, N, e)
  xs = [draw(rng, shape(L_, E_)), draw(rng, shape(S_, kd or E_)), draw(rng, shape(S_, vd or E_))]
  fx = [fg.tensor(x, device=device, requires_grad=True) for x in xs]
  tx = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
  am, kpm = _masks(rng, mask, N, H_, L_, S_)
  if unbatched and kpm is not None: kpm = kpm[0]
  fkw, tkw = {"need_weights": need_weights, "average_attn_weights": avg}, {"need_weights": need_weights,
                                                                           "average_attn_weights": avg}
  if am is not None:
    fkw["attn_mask"] = fg.tensor(am, device=device)
    tkw["attn_mask"] = torch.tensor(am) if am.dtype == bool else torch.tensor(am, dtype=torch.float64)
  if kpm is not None:
    fkw["key_padding_mask"] = fg.tensor(kpm, device=device)
    tkw["key_padding_mask"] = torch.tensor(kpm) if kpm.dtype == bool else torch.tensor(kpm, dtype=torch.float64)
  if mask == "causal": fkw["is_causal"] = tkw["is_causal"] = True
  check_module(ours, theirs, fx, tx, rng, fkw=fkw, tkw=tkw)


def test_multihead_attention_dropout(rng):
  """training with dropout: the returned weights are the dropped-out ones the values were averaged with (torch's);
  with identity projections the output is exactly weights @ value per head"""
  E, H, L, S = 4, 2, 6, 7
  m = fnn.MultiheadAttention(E, H, dropout=0.5, batch_first=True)
  eye = np.eye(E, dtype=np.float32)
  sd = m.state_dict()
  sd["in_proj_weight"] = fg.tensor(np.concatenate([eye * 0.3, eye, eye]))
  sd["in_proj_bias"] = fg.zeros(3 * E)
  sd["out_proj.weight"], sd["out_proj.bias"] = fg.tensor(eye), fg.zeros(E)
  m.load_state_dict(sd)
  q, k, v = draw(rng, (2, L, E)), draw(rng, (2, S, E)), draw(rng, (2, S, E))
  fg.manual_seed(5)
  out, w = m(fg.tensor(q), fg.tensor(k), fg.tensor(v), average_attn_weights=False)
  out, w = out.numpy(), w.numpy()
  assert w.shape == (2, H, L, S)
  assert np.any(w == 0) and not np.allclose(w.sum(-1), 1)        # dropped out and rescaled by 2
  vh = v.reshape(2, S, H, E // H).transpose(0, 2, 1, 3)
  want = (w @ vh).transpose(0, 2, 1, 3).reshape(2, L, E)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
  # eval: no dropout, rows of the weights sum to 1
  m.eval()
  _, w = m(fg.tensor(q), fg.tensor(k), fg.tensor(v))
  np.testing.assert_allclose(w.numpy().sum(-1), 1, rtol=1e-5)


def test_multihead_attention_errors():
  with pytest.raises(AssertionError): torch.nn.MultiheadAttention(10, 3)
  with pytest.raises(AssertionError): fnn.MultiheadAttention(10, 3)
  with pytest.raises(ValueError): fnn.MultiheadAttention(0, 2)
  m = fnn.MultiheadAttention(8, 2)
  with pytest.raises(AssertionError):      # torch: AssertionError, embedding dimension mismatch
    torch.nn.MultiheadAttention(8, 2)(*[torch.zeros(3, 2, 6)] * 3)
  with pytest.raises(AssertionError):
    m(*[fg.zeros(3, 2, 6)] * 3)


# ---- constructor and input errors: the same exception types as torch ----------------------------------------------

BAD_CTOR = [
  lambda L: L.Conv2d(3, 4, 3, groups=2),               # in_channels not divisible by groups
  lambda L: L.Conv2d(4, 3, 3, groups=2),               # out_channels not divisible
  lambda L: L.Conv2d(4, 4, 3, groups=0),
  lambda L: L.Conv2d(3, 4, 3, padding_mode="mirror"),
  lambda L: L.Conv2d(3, 4, 3, padding="full"),
  lambda L: L.Conv2d(3, 4, 3, stride=2, padding="same"),
  lambda L: L.Conv1d(3, 4, 3, padding="same", stride=2),
  lambda L: L.ConvTranspose2d(3, 4, 3, padding_mode="reflect"),
  lambda L: L.GroupNorm(4, 6),
  lambda L: L.Dropout(2.0),
]


@pytest.mark.parametrize("i", range(len(BAD_CTOR)))
def test_bad_constructor_args(i):
  with pytest.raises(Exception) as want:
    BAD_CTOR[i](torch.nn)
  with pytest.raises(want.type):
    BAD_CTOR[i](fnn)


BAD_INPUT = [   # (module builder, input shape)
  (lambda L: L.Conv2d(3, 4, 3), (2, 4, 6, 6)),           # wrong channels
  (lambda L: L.Conv2d(3, 4, 3), (2, 3, 6)),              # wrong ndim (3D is unbatched [C, H, W]: 3 != C)
  (lambda L: L.Conv2d(3, 4, 3), (1, 2, 3, 6, 6)),        # 5D
  (lambda L: L.Conv1d(3, 4, 3), (2, 3)),                 # 2D is unbatched [C, L] with C=2
  (lambda L: L.Conv2d(3, 4, 5), (1, 3, 4, 4)),           # kernel larger than the input
  (lambda L: L.ConvTranspose2d(3, 4, 3), (2, 4, 5, 5)),
  (lambda L: L.Linear(5, 3), (2, 4)),
  (lambda L: L.LayerNorm(8), (2, 7)),
  (lambda L: L.GroupNorm(2, 6), (2, 4, 3)),
  (lambda L: L.MaxPool2d(2), (2, 3, 4, 5, 6)),
  (lambda L: L.MaxPool2d(3, padding=2), (1, 1, 6, 6)),   # padding over half the kernel
  (lambda L: L.AvgPool2d(5), (1, 1, 3, 3)),              # output would be empty
  (lambda L: L.RMSNorm(4), (2, 5)),
]


@pytest.mark.parametrize("i", range(len(BAD_INPUT)))
def test_bad_inputs(i):
  build, shape = BAD_INPUT[i]
  with pytest.raises(Exception) as want:
    build(torch.nn)(torch.zeros(shape))
  with pytest.raises(want.type):
    build(fnn)(fg.zeros(*shape))


# ---- kernel counts (CPU) ----------------------------------------------------------------------------------------

def kernels(fn) -> int:
  with fg.track() as t:
    fn()
  return len(t.kernels)


def _ready(m: fnn.Module, *shape):
  fg.realize(*m.parameters(), *m.buffers())
  rng = np.random.default_rng()
  if m.__class__ is fnn.Embedding: return fg.tensor(rng.integers(0, m.num_embeddings, size=shape)).realize()
  return fg.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True).realize()


@pytest.mark.parametrize("build,shape", [
  (lambda: fnn.Conv2d(3, 8, 3, padding=1), (2, 3, 8, 8)),
  (lambda: fnn.Conv1d(4, 4, 3, groups=2, bias=False), (2, 4, 9)),
  (lambda: fnn.ConvTranspose2d(4, 4, 3, stride=2), (2, 4, 5, 5)),
  (lambda: fnn.Linear(16, 8), (4, 16)),
  (lambda: fnn.LayerNorm(16), (4, 16)),
  (lambda: fnn.RMSNorm(16), (4, 16)),
  (lambda: fnn.GroupNorm(2, 8), (4, 8, 6, 6)),
  (lambda: fnn.MaxPool2d(2), (2, 3, 8, 8)),
  (lambda: fnn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (2, 3, 8, 8)),
  (lambda: fnn.AdaptiveAvgPool2d(3), (2, 3, 8, 8)),
  (lambda: fnn.Embedding(10, 8), (4, 5)),
  (lambda: fnn.Sequential(fnn.Linear(16, 8), fnn.GELU(), fnn.Dropout(0.0)), (4, 16)),
])
def test_forward_is_one_kernel(build, shape):
  m = build()
  x = _ready(m, *shape)
  assert kernels(lambda: m(x).realize()) == 1


@pytest.mark.parametrize("build,shape", [
  (lambda: fnn.Linear(16, 8, bias=False), (4, 16)),
  (lambda: fnn.MaxPool2d(2), (2, 3, 8, 8)),
  (lambda: fnn.AvgPool2d(3, stride=2, padding=1), (2, 3, 8, 8)),
  (lambda: fnn.AdaptiveAvgPool2d(3), (2, 3, 8, 8)),
  (lambda: fnn.Embedding(10, 8), (4, 5)),
])
def test_backward_kernel_count(build, shape):
  """one kernel per gradient (pooling routes g back through its window view; embedding scatters by a one-hot sum)"""
  m = build()
  x = _ready(m, *shape)
  m(x).sum().backward()
  for t in [x, *m.parameters()]:
    if t.requires_grad: assert kernels(lambda: t.grad.realize()) == 1, tuple(t.shape)
