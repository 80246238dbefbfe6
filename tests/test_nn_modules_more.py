"""The nn modules real PyTorch programs use, against torch (CPU) with the same weights (torch's state_dict loaded)
and fresh random inputs: forward values, shapes, dtypes, input and parameter gradients, state_dict keys, reprs, init
distributions and errors. Activations (PReLU, RReLU, the shrinks, Threshold, Softsign and the ones that existed),
resampling (PixelShuffle/Unshuffle, Upsample and its 2d forms, Fold/Unfold, ChannelShuffle), the padding modules,
Bilinear, EmbeddingBag, CosineSimilarity/PairwiseDistance, ParameterList/ParameterDict, LocalResponseNorm,
CrossMapLRN2d, the dropouts (statistics while training, identity in eval), weight_norm and spectral_norm (hook and
parametrization forms), Identity/Flatten/Unflatten."""
from __future__ import annotations
import math
import warnings
from collections import OrderedDict
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as fnn
import fusegrad.nn.functional as FF
from fusegrad.engine.jit import host_reads

T = torch.nn
TF = torch.nn.functional


def _same_error(ffn, tfn, message: bool = True):
  with pytest.raises(Exception) as te: tfn()
  with pytest.raises(type(te.value)) as fe: ffn()
  if message: assert str(te.value).split("\n")[0][:60] == str(fe.value).split("\n")[0][:60]


def _np_state(m) -> OrderedDict:
  return OrderedDict((k, v.detach().numpy().copy()) for k, v in m.state_dict().items())


def _load(fm, tm) -> None:
  """torch's state_dict, as numpy arrays, into fusegrad's module (same keys, shapes and dtypes)."""
  sd = _np_state(tm)
  assert list(fm.state_dict()) == list(sd)
  for k, v in fm.state_dict().items(): assert tuple(v.shape) == sd[k].shape and v.dtype.name == str(sd[k].dtype), k
  fm.load_state_dict(OrderedDict((k, fg.tensor(v)) for k, v in sd.items()))


def _randomize(tm, rng) -> None:
  """New random parameter values (so a test of forward and gradients does not rest on a constant init)."""
  with torch.no_grad():
    for p in tm.parameters(): p.copy_(torch.tensor(rng.uniform(-1, 1, tuple(p.shape)).astype(np.float32)))


def _compare(fm, tm, arrays, rng, rtol=1e-5, atol=1e-6, grad=True, kwargs_fn=None):
  """Run both modules on the same inputs (float arrays require grad); compare outputs, then input and parameter
  gradients of sum(out * random weights)."""
  _load(fm, tm)
  targs, fargs = [], []
  for a in arrays:
    g = grad and isinstance(a, np.ndarray) and a.dtype.kind == "f"
    if isinstance(a, np.ndarray):
      targs.append(torch.tensor(a, requires_grad=g)); fargs.append(fg.tensor(a, requires_grad=g))
    else:
      targs.append(a); fargs.append(a)
  kw = kwargs_fn() if kwargs_fn else ({}, {})
  ty, fy = tm(*targs, **kw[0]), fm(*fargs, **kw[1])
  assert tuple(fy.shape) == tuple(ty.shape) and fy.dtype.name == str(ty.dtype).replace("torch.", "")
  np.testing.assert_allclose(fy.numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
  if not grad or not ty.requires_grad: return fy, ty
  w = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
  (ty * torch.tensor(w)).sum().backward()
  (fy * fg.tensor(w)).sum().backward()
  for ft, tt in zip(fargs, targs):
    if isinstance(tt, torch.Tensor) and tt.requires_grad:
      np.testing.assert_allclose(ft.grad.numpy(), tt.grad.numpy(), rtol=rtol * 10, atol=atol * 10)
  tp, fp = dict(tm.named_parameters()), dict(fm.named_parameters())
  assert list(tp) == list(fp)
  for k, p in tp.items():
    if p.grad is None: assert fp[k].grad is None, k
    else: np.testing.assert_allclose(fp[k].grad.numpy(), p.grad.numpy(), rtol=rtol * 10, atol=atol * 10, err_msg=k)
  return fy, ty


def _build(name, *args, **kwargs):
  return getattr(fnn, name)(*args, **kwargs), getattr(T, name)(*args, **kwargs)


# ---- what exists ---------------------------------------------------------------------------------------------------

_NEW = ["PReLU", "RReLU", "Hardshrink", "Softshrink", "Tanhshrink", "Threshold", "Softsign", "PixelShuffle",
        "PixelUnshuffle", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "Fold", "Unfold", "ChannelShuffle",
        "Bilinear", "EmbeddingBag", "CosineSimilarity", "ParameterList", "ParameterDict", "LocalResponseNorm",
        "CrossMapLRN2d", "AlphaDropout", "FeatureAlphaDropout", "Dropout1d", "Dropout2d", "Dropout3d"] + \
       [f"{k}Pad{d}d" for k in ("Zero", "Constant", "Reflection", "Replication", "Circular") for d in (1, 2, 3)]
_EXISTING = ["LogSigmoid", "Hardtanh", "ReLU6", "Hardsigmoid", "Hardswish", "Mish", "SiLU", "GELU", "PairwiseDistance",
             "Identity", "Flatten", "Unflatten"]


def test_every_module_exists():
  for name in _NEW + _EXISTING: assert hasattr(fnn, name), name
  for name in ("prelu", "rrelu", "hardshrink", "softshrink", "tanhshrink", "threshold", "softsign", "channel_shuffle",
               "bilinear", "local_response_norm", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d",
               "dropout3d"):
    assert callable(getattr(FF, name)), name
  for name in ("weight_norm", "remove_weight_norm", "spectral_norm", "remove_spectral_norm"):
    assert callable(getattr(fnn.utils, name))
  assert callable(fnn.utils.parametrizations.weight_norm) and callable(fnn.utils.parametrizations.spectral_norm)
  assert issubclass(fnn.ZeroPad2d, fnn.ConstantPad2d) and issubclass(fnn.UpsamplingBilinear2d, fnn.Upsample)


_REPRS = [("PReLU", (3,), {}), ("PReLU", (), {"init": 0.1}), ("RReLU", (0.1, 0.3), {}),
          ("RReLU", (), {"inplace": True}),
          ("Hardshrink", (), {}), ("Softshrink", (0.3,), {}), ("Tanhshrink", (), {}), ("Threshold", (0.1, 20), {}),
          ("Threshold", (0.1, 2.0, True), {}), ("Softsign", (), {}), ("PixelShuffle", (2,), {}),
          ("PixelUnshuffle", (3,), {}), ("ChannelShuffle", (3,), {}), ("Upsample", (), {"scale_factor": 2}),
          ("Upsample", ((3, 4),), {"mode": "bilinear"}), ("Upsample", (), {"scale_factor": (2, 3)}),
          ("UpsamplingNearest2d", (), {"size": 5}), ("UpsamplingBilinear2d", (), {"scale_factor": 2}),
          ("Fold", (3, 2), {}), ("Fold", ((4, 5), (2, 3)), {"stride": 2}), ("Unfold", ((2, 3),), {"padding": 1}),
          ("Bilinear", (2, 3, 4), {}), ("Bilinear", (2, 3, 4), {"bias": False}), ("EmbeddingBag", (10, 3), {}),
          ("EmbeddingBag", (10, 3), {"mode": "sum", "padding_idx": -2}), ("CosineSimilarity", (), {"dim": 2}),
          ("PairwiseDistance", (), {}), ("LocalResponseNorm", (3,), {}), ("CrossMapLRN2d", (5, 1e-3), {}),
          ("AlphaDropout", (0.2,), {}), ("FeatureAlphaDropout", (), {}), ("Dropout1d", (), {}),
          ("Dropout2d", (0.3,), {}), ("Dropout3d", (), {"inplace": True}), ("ZeroPad2d", (1,), {}),
          ("ZeroPad1d", ((1, 2),), {}), ("ConstantPad1d", ((1, 2), 3.5), {}), ("ConstantPad3d", (1, -1.0), {}),
          ("ReflectionPad3d", (1,), {}), ("ReplicationPad2d", ([1, 2, 3, 4],), {}),
          ("CircularPad2d", ((1, 2, 3, 4),), {}),
          ("Hardtanh", (), {}), ("GELU", (), {"approximate": "tanh"}), ("Identity", (), {}), ("Flatten", (), {}),
          ("Unflatten", (1, (2, 3)), {}), ("LogSigmoid", (), {}), ("Mish", (), {})]


@pytest.mark.parametrize("name,args,kwargs", _REPRS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(_REPRS)])
def test_repr(name, args, kwargs):
  fm, tm = _build(name, *args, **kwargs)
  assert repr(fm) == repr(tm)


def test_module_repr_layout():
  # an extra_repr beside children goes on its own line, as torch's Module.__repr__
  def make(nn):
    class M(nn.Module):
      def __init__(self):
        super().__init__()
        self.lin, self.pad = nn.Linear(2, 3), nn.ZeroPad1d(1)
      def extra_repr(self): return "a=1\nb=2"
    return M()
  assert repr(make(fnn)) == repr(make(T))


# ---- activations ---------------------------------------------------------------------------------------------------

_ACTS = [("Hardshrink", (), (3, 7)), ("Hardshrink", (0.9,), (2, 3, 4)), ("Softshrink", (), (3, 7)),
         ("Softshrink", (1.2,), (5,)), ("Softshrink", (0.0,), (6,)), ("Tanhshrink", (), (4, 5)),
         ("Threshold", (0.3, -2.0), (3, 6)), ("Threshold", (-1, 7), (8,)), ("Softsign", (), (3, 5)),
         ("LogSigmoid", (), (3, 5)), ("Hardtanh", (-0.5, 1.5), (4, 6)), ("ReLU6", (), (4, 6)),
         ("Hardsigmoid", (), (4, 6)),
         ("Hardswish", (), (4, 6)), ("Mish", (), (4, 6)), ("SiLU", (), (4, 6)), ("GELU", (), (4, 6)),
         ("GELU", ("tanh",), (4, 6)), ("RReLU", (0.1, 0.4), (3, 5)), ("Identity", (), (2, 3))]


@pytest.mark.parametrize("name,args,shape", _ACTS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(_ACTS)])
def test_activation(name, args, shape, rng):
  fm, tm = _build(name, *args)
  fm.eval(); tm.eval()   # (RReLU: the fixed mean slope)
  x = (rng.standard_normal(shape) * 3).astype(np.float32)
  _compare(fm, tm, [x], rng)


def test_activation_nan_and_dtypes(rng):
  x = np.array([np.nan, -1.0, 0.2, 0.5, -0.5, 2.0, -3.0], np.float32)
  for name, args in (("Hardshrink", ()), ("Softshrink", ()), ("Threshold", (0.5, -3.0)), ("Softsign", ()),
                     ("Tanhshrink", ()), ("PReLU", ())):
    fm, tm = _build(name, *args)
    _load(fm, tm)
    np.testing.assert_allclose(fm(fg.tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-6)
  x64 = rng.standard_normal((3, 4))
  for name, args in (("Hardshrink", ()), ("Softshrink", (0.3,)), ("Threshold", (0.1, 5.0)), ("Softsign", ()),
                     ("Tanhshrink", ())):
    fm, tm = _build(name, *args)
    fy, ty = fm(fg.tensor(x64)), tm(torch.tensor(x64))
    assert fy.dtype == fg.float64
    np.testing.assert_allclose(fy.numpy(), ty.numpy(), rtol=1e-12, atol=1e-15)   # (tanhshrink cancels near 0)
  _same_error(lambda: FF.softshrink(fg.tensor(x), -1.0), lambda: TF.softshrink(torch.tensor(x), -1.0))


_PRELU = [((), {}, (2, 3, 4)), ((3,), {}, (2, 3, 4)), ((3,), {"init": 0.1}, (5, 3)), ((1,), {}, (7,)), ((), {}, ()),
          ((4,), {}, (2, 4, 3, 2))]


@pytest.mark.parametrize("args,kwargs,shape", _PRELU)
def test_prelu(args, kwargs, shape, rng):
  fm, tm = _build("PReLU", *args, **kwargs)
  assert list(fm.state_dict()) == ["weight"] and tuple(fm.weight.shape) == tuple(tm.weight.shape)
  want = np.full(tuple(tm.weight.shape), kwargs.get("init", 0.25), np.float32)
  np.testing.assert_array_equal(fm.weight.numpy(), want)
  _randomize(tm, rng)
  _compare(fm, tm, [rng.standard_normal(shape).astype(np.float32)], rng)


def test_prelu_errors(rng):
  x = rng.standard_normal((2, 4)).astype(np.float32)
  for n, shape in ((3, (2, 4)), (3, (3,)), (3, ())):
    fm, tm = _build("PReLU", n)
    a = rng.standard_normal(shape).astype(np.float32)
    _same_error(lambda: fm(fg.tensor(a)), lambda: tm(torch.tensor(a)))
  w = rng.standard_normal(4)
  _same_error(lambda: FF.prelu(fg.tensor(x), fg.tensor(w)), lambda: TF.prelu(torch.tensor(x), torch.tensor(w)))
  w2 = rng.standard_normal((4, 1)).astype(np.float32)
  _same_error(lambda: FF.prelu(fg.tensor(x), fg.tensor(w2)), lambda: TF.prelu(torch.tensor(x), torch.tensor(w2)))


def test_rrelu_training_statistics(rng):
  lower, upper = 0.1, 0.4
  fm = fnn.RReLU(lower, upper)
  x = rng.standard_normal(40000).astype(np.float32)
  fx = fg.tensor(x, requires_grad=True)
  y = fm(fx)
  y.sum().backward()
  yn, g = y.numpy(), fx.grad.numpy()
  pos, neg = x > 0, x < 0
  np.testing.assert_array_equal(yn[pos], x[pos])
  np.testing.assert_array_equal(g[pos], 1.0)
  slope = yn[neg] / x[neg]
  assert slope.min() >= lower - 1e-6 and slope.max() <= upper + 1e-6
  assert abs(slope.mean() - (lower + upper) / 2) < 0.01 and abs(slope.std() - (upper - lower) / math.sqrt(12)) < 0.01
  np.testing.assert_allclose(g[neg], slope, rtol=1e-5)   # the gradient is each element's own slope
  assert len(np.unique(slope)) > 1000
  # torch draws from the same distribution
  ts = torch.nn.RReLU(lower, upper)(torch.tensor(x)).numpy()[neg] / x[neg]
  assert abs(ts.mean() - slope.mean()) < 0.01
  fm.eval()
  np.testing.assert_allclose(fm(fg.tensor(x)).numpy(), np.where(x > 0, x, x * (lower + upper) / 2), rtol=1e-6)
  _same_error(lambda: FF.rrelu(fg.tensor(x), 0.5, 0.1, True), lambda: TF.rrelu(torch.tensor(x), 0.5, 0.1, True))


# ---- resampling and rearranging ------------------------------------------------------------------------------------

_RESAMPLE = [("PixelShuffle", (2,), (2, 8, 3, 4)), ("PixelShuffle", (3,), (9, 2, 3)),
             ("PixelUnshuffle", (2,), (2, 3, 4, 6)),
             ("PixelUnshuffle", (3,), (1, 2, 2, 6, 3)), ("ChannelShuffle", (3,), (2, 6, 4, 3)),
             ("ChannelShuffle", (2,), (3, 4, 5)), ("ChannelShuffle", (4,), (2, 8, 2, 2, 3)),
             ("Upsample", (None, 2), (2, 3, 4, 5)), ("Upsample", ((5, 7),), (2, 3, 4, 5)),
             ("Upsample", (None, 2, "bilinear"), (2, 3, 4, 5)), ("Upsample", (None, 2, "bilinear", True), (2, 3, 4, 5)),
             ("Upsample", ((6, 9), None, "bicubic", False), (1, 2, 4, 5)), ("Upsample", (None, 3, "linear"), (2, 3, 5)),
             ("Upsample", (7, None, "linear", True), (2, 3, 5)), ("Upsample", (None, 2, "trilinear"), (1, 2, 3, 4, 2)),
             ("Upsample", (None, (2, 3), "nearest"), (1, 2, 3, 4)), ("Upsample", (None, 1.5, "bilinear"), (1, 2, 4, 6)),
             ("Upsample", ((2, 3), None, "area"), (1, 2, 4, 6)), ("Upsample", (None, 2, "nearest-exact"), (1, 2, 3)),
             ("UpsamplingNearest2d", (None, 2), (2, 3, 3, 4)), ("UpsamplingNearest2d", ((5, 6),), (2, 3, 3, 4)),
             ("UpsamplingBilinear2d", (None, 2), (2, 3, 3, 4)), ("UpsamplingBilinear2d", ((4, 7),), (1, 2, 3, 4)),
             ("Unfold", ((2, 3),), (2, 3, 6, 7)), ("Unfold", (3, 1, 1, 2), (2, 2, 7, 6)), ("Unfold", (2, 2), (3, 5, 6)),
             ("Fold", ((5, 6), 2), (2, 12, 20)), ("Fold", ((7, 6), (3, 2), 1, 1, 2), (2, 6, 16)),
             ("Fold", (4, 2, 1, 0, 2), (8, 4)), ("Identity", (), (2, 3)), ("Flatten", (), (2, 3, 4)),
             ("Flatten", (0, 1), (2, 3, 4)), ("Unflatten", (1, (2, 3)), (4, 6, 2))]


@pytest.mark.parametrize("name,args,shape", _RESAMPLE, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(_RESAMPLE)])
def test_resample(name, args, shape, rng):
  fm, tm = _build(name, *args)
  _compare(fm, tm, [rng.standard_normal(shape).astype(np.float32)], rng, rtol=1e-5, atol=1e-5)


def test_resample_errors(rng):
  cases = [("PixelShuffle", (2,), (2, 3)), ("PixelShuffle", (2,), (1, 6, 3, 3)), ("PixelUnshuffle", (2,), (1, 2, 3, 4)),
           ("PixelUnshuffle", (2,), (1, 2, 4, 3)), ("ChannelShuffle", (2,), (2, 5, 3)),
           ("ChannelShuffle", (2,), (2, 6)),
           ("ChannelShuffle", (0,), (2, 6, 3)), ("Upsample", (None, 2, "bilinear"), (1, 2, 3)),
           ("Upsample", (), (1, 2, 3)), ("Upsample", (3, None, "nearest", True), (1, 2, 3)),
           ("Fold", (4, 2), (1, 8, 5)), ("Unfold", (2,), (1, 2, 3, 4, 5))]
  for name, args, shape in cases:
    fm, tm = _build(name, *args)
    a = rng.standard_normal(shape).astype(np.float32)
    _same_error(lambda: fm(fg.tensor(a)), lambda: tm(torch.tensor(a)))


# ---- padding -------------------------------------------------------------------------------------------------------

def _pad_cases():
  out = []
  for nd in (1, 2, 3):
    sp = (5, 4, 6)[:nd]
    for kind in ("Zero", "Constant", "Reflection", "Replication", "Circular"):
      for batched in (True, False):
        shape = ((2, 3) if batched else (3,)) + sp
        pad = (1, 2, 3, 0, 2, 1)[:2 * nd]
        args = (pad, 1.5) if kind == "Constant" else (pad,)
        out.append((f"{kind}Pad{nd}d", args, shape))
      out.append((f"{kind}Pad{nd}d", (1, -0.5) if kind == "Constant" else (1,), (2, 3) + sp))
  out.append(("ZeroPad2d", ((-1, 2, 0, 1),), (2, 3, 4, 5)))
  out.append(("ConstantPad1d", (2, 1.0), (2, 3, 4, 5)))    # constant padding of any input rank
  return out


@pytest.mark.parametrize("name,args,shape", _pad_cases(), ids=lambda v: str(v).replace(" ", ""))
def test_padding(name, args, shape, rng):
  fm, tm = _build(name, *args)
  assert fm.padding == tm.padding
  _compare(fm, tm, [rng.standard_normal(shape).astype(np.float32)], rng)


def test_padding_errors(rng):
  cases = [("CircularPad1d", (1,), (2, 3, 4, 5)), ("CircularPad2d", (1,), (4, 5)), ("CircularPad3d", (1,), (3, 4, 5)),
           ("ReflectionPad1d", (5,), (2, 3, 5)), ("ReflectionPad1d", (2,), (2, 3, 4, 5)),
           ("ReplicationPad2d", (1,), (5,)), ("CircularPad1d", (6,), (2, 3, 5))]
  for name, args, shape in cases:
    fm, tm = _build(name, *args)
    a = rng.standard_normal(shape).astype(np.float32)
    _same_error(lambda: fm(fg.tensor(a)), lambda: tm(torch.tensor(a)), message=False)
  fm, tm = _build("ReplicationPad2d", (1, 2, 3))     # a padding of the wrong length fails in forward, as torch's
  a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
  _same_error(lambda: fm(fg.tensor(a)), lambda: tm(torch.tensor(a)), message=False)


# ---- Bilinear, EmbeddingBag, distances -----------------------------------------------------------------------------

def test_bilinear_init(rng):
  fm, tm = _build("Bilinear", 16, 5, 40)
  shapes = lambda m: [(k, tuple(v.shape)) for k, v in m.state_dict().items()]   # noqa: E731
  assert shapes(fm) == shapes(tm)
  bound = 1 / math.sqrt(16)
  for p in (fm.weight.numpy(), fm.bias.numpy()):
    assert np.abs(p).max() <= bound and np.abs(p).max() > 0.8 * bound and abs(p.mean()) < 0.3 * bound
  assert fm.weight.numpy().std() == pytest.approx(bound / math.sqrt(3), rel=0.1)
  _same_error(lambda: fnn.Bilinear(0, 3, 2), lambda: T.Bilinear(0, 3, 2))


@pytest.mark.parametrize("shapes,bias", [(((4, 3), (4, 5)), True), (((2, 4, 3), (2, 4, 5)), True), (((3,), (5,)), True),
                                         (((4, 3), (4, 5)), False)])
def test_bilinear(shapes, bias, rng):
  fm, tm = _build("Bilinear", 3, 5, 6, bias=bias)
  _compare(fm, tm, [rng.standard_normal(s).astype(np.float32) for s in shapes], rng, rtol=1e-5, atol=1e-5)


def test_bilinear_errors(rng):
  f32 = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
  for a, b, w, bias in ((f32(2, 3), f32(2, 4), f32(5, 3, 5), None), (f32(2, 3), f32(3, 4), f32(5, 3, 4), None),
                        (f32(2, 3), f32(2, 1, 4), f32(5, 3, 4), None), (f32(2, 3), f32(2, 4), f32(5, 3, 4), f32(4)),
                        (f32(2, 3), f32(2, 4), f32(5, 4, 4), None)):
    tb, fb = (torch.tensor(bias), fg.tensor(bias)) if bias is not None else (None, None)
    _same_error(lambda: FF.bilinear(fg.tensor(a), fg.tensor(b), fg.tensor(w), fb),
                lambda: TF.bilinear(torch.tensor(a), torch.tensor(b), torch.tensor(w), tb))


def test_embedding_bag_init(rng):
  fm, tm = _build("EmbeddingBag", 200, 50, padding_idx=3)
  w = fm.weight.numpy()
  assert list(fm.state_dict()) == ["weight"] and w.shape == (200, 50)
  np.testing.assert_array_equal(w[3], 0)
  assert abs(w.mean()) < 0.05 and w.std() == pytest.approx(1.0, rel=0.05)
  assert fnn.EmbeddingBag(10, 3, padding_idx=-2).padding_idx == 8
  e = rng.standard_normal((6, 4)).astype(np.float32)
  fb = fnn.EmbeddingBag.from_pretrained(fg.tensor(e), mode="sum")
  tb = T.EmbeddingBag.from_pretrained(torch.tensor(e), mode="sum")
  assert not fb.weight.requires_grad and repr(fb) == repr(tb)
  np.testing.assert_array_equal(fb.weight.numpy(), e)


_BAGS = [("sum", "1d", {}), ("mean", "1d", {}), ("max", "1d", {}), ("sum", "2d", {}), ("mean", "2d", {}),
         ("max", "2d", {}), ("sum", "1d", {"padding_idx": 2}), ("mean", "1d", {"padding_idx": 2}),
         ("max", "2d", {"padding_idx": 2}), ("sum", "1d", {"include_last_offset": True}),
         ("mean", "1d", {"include_last_offset": True}), ("sum", "psw", {}), ("sum", "psw2d", {})]


@pytest.mark.parametrize("mode,kind,kwargs", _BAGS, ids=[f"{m}-{k}-{i}" for i, (m, k, _) in enumerate(_BAGS)])
def test_embedding_bag(mode, kind, kwargs, rng):
  fm, tm = _build("EmbeddingBag", 10, 4, mode=mode, **kwargs)
  _randomize(tm, rng)
  if kind in ("2d", "psw2d"): idx, offsets = rng.integers(0, 10, (3, 4)), None
  else:
    idx = rng.integers(0, 10, 9)
    idx[1] = 2                                   # a padding index in the first bag when padding_idx=2
    offsets = np.array([0, 3, 3, 7] + ([9] if kwargs.get("include_last_offset") else []))   # an empty bag
  psw = rng.standard_normal(idx.shape).astype(np.float32) if kind.startswith("psw") else None
  args = [idx] + ([offsets] if offsets is not None else [None]) + ([psw] if psw is not None else [])
  _compare(fm, tm, args, rng, rtol=1e-5, atol=1e-5)


def test_embedding_bag_errors(rng):
  w = rng.standard_normal((10, 3)).astype(np.float32)
  i1, i2, off = np.array([1, 2, 3]), np.array([[1, 2, 3]]), np.array([0, 1])
  F_, TF_ = FF.embedding_bag, TF.embedding_bag
  fw, tw = fg.tensor(w), torch.tensor(w)
  _same_error(lambda: F_(fg.tensor(i1), fw, fg.tensor(off), mode="mean", per_sample_weights=fg.rand(3)),
              lambda: TF_(torch.tensor(i1), tw, torch.tensor(off), mode="mean", per_sample_weights=torch.rand(3)))
  _same_error(lambda: F_(fg.tensor(i2), fw, fg.tensor(off)), lambda: TF_(torch.tensor(i2), tw, torch.tensor(off)))
  _same_error(lambda: F_(fg.tensor(i1), fw, None), lambda: TF_(torch.tensor(i1), tw, None))
  _same_error(lambda: fnn.EmbeddingBag(10, 3, mode="foo")(fg.tensor(i1), fg.tensor(off)),
              lambda: T.EmbeddingBag(10, 3, mode="foo")(torch.tensor(i1), torch.tensor(off)))
  for p in (10, -11):
    _same_error(lambda: fnn.EmbeddingBag(10, 3, padding_idx=p), lambda: T.EmbeddingBag(10, 3, padding_idx=p))
  _same_error(lambda: fnn.EmbeddingBag.from_pretrained(fg.randn(3)),
              lambda: T.EmbeddingBag.from_pretrained(torch.randn(3)))


@pytest.mark.parametrize("name,kwargs,shapes", [("CosineSimilarity", {}, ((4, 5), (4, 5))),
                                                ("CosineSimilarity", {"dim": -1, "eps": 1e-3}, ((3, 1, 4), (1, 5, 4))),
                                                ("CosineSimilarity", {"dim": 0}, ((6,), (6,))),
                                                ("PairwiseDistance", {}, ((4, 5), (4, 5))),
                                                ("PairwiseDistance", {"p": 1.0, "keepdim": True}, ((4, 5), (1, 5))),
                                                ("PairwiseDistance", {"p": 3.0, "eps": 1e-3}, ((2, 3, 5), (2, 3, 5)))])
def test_distances(name, kwargs, shapes, rng):
  fm, tm = _build(name, **kwargs)
  _compare(fm, tm, [rng.standard_normal(s).astype(np.float32) for s in shapes], rng, rtol=1e-5, atol=1e-6)


# ---- ParameterList / ParameterDict ---------------------------------------------------------------------------------

def _holder(nn, lib, arrays):
  class Holder(nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = nn.Linear(2, 2)
      self.plist = nn.ParameterList([nn.Parameter(lib.tensor(arrays[0])), lib.tensor(arrays[1])])
      self.pdict = nn.ParameterDict({"z": nn.Parameter(lib.tensor(arrays[2])), "a": lib.tensor(arrays[3])})
    def forward(self, x):
      y = self.lin(x) * self.plist[0] + self.plist[-1].sum()
      return y * self.pdict["z"] + self.pdict["a"]
  return Holder()


def test_parameter_containers_in_a_module(rng):
  arrays = [rng.standard_normal(s).astype(np.float32) for s in ((2,), (3,), (2,), (1,))]
  fm, tm = _holder(fnn, fg, arrays), _holder(T, torch, arrays)
  assert list(fm.state_dict()) == list(tm.state_dict()) == ["lin.weight", "lin.bias", "plist.0", "plist.1", "pdict.a",
                                                            "pdict.z"]
  assert [n for n, _ in fm.named_parameters()] == [n for n, _ in tm.named_parameters()]
  assert len(list(fm.parameters())) == 6 and all(isinstance(p, fnn.Parameter) for p in fm.plist)
  _compare(fm, tm, [rng.standard_normal((3, 2)).astype(np.float32)], rng)
  assert repr(fm.plist) == repr(tm.plist).replace("torch.", "fusegrad.")
  assert repr(fm).count("Parameter containing") == 4


def test_parameter_list_ops(rng):
  for lib, nn in ((fg, fnn), (torch, T)):
    pl = nn.ParameterList()
    pl.append(lib.ones(2)).extend([lib.zeros(3), nn.Parameter(lib.ones(1), requires_grad=False)])
    pl += [lib.ones(4)]
    pl.append("not a tensor")
    assert len(pl) == 5 and [tuple(p.shape) for p in list(pl)[:4]] == [(2,), (3,), (1,), (4,)]
    assert isinstance(pl[1], nn.Parameter) and not pl[2].requires_grad and pl[-1] == "not a tensor"
    assert len(list(pl.parameters())) == 4 and [n for n, _ in pl.named_parameters()] == ["0", "1", "2", "3"]
    sl = pl[1:3]
    assert isinstance(sl, nn.ParameterList) and len(sl) == 2 and sl[0] is pl[1]
    pl[0] = lib.full((5,), 2.0)
    assert isinstance(pl[0], nn.Parameter) and tuple(pl[0].shape) == (5,)
    assert "0" not in dir(pl)
  fl, tl = fnn.ParameterList([fg.ones(2)]), T.ParameterList([torch.ones(2)])
  _same_error(lambda: fl[3], lambda: tl[3])
  _same_error(lambda: fl.extend(fg.ones(2)), lambda: tl.extend(torch.ones(2)))
  _same_error(lambda: fl(1), lambda: tl(1))


def test_parameter_dict_ops(rng):
  for lib, nn in ((fg, fnn), (torch, T)):
    pd = nn.ParameterDict({"b": lib.ones(2), "a": lib.zeros(1)})
    assert list(pd.keys()) == ["a", "b"]                                  # a plain dict: sorted, as torch's
    pd.update([("d", lib.ones(3)), ("c", lib.ones(4))])                  # pairs: in order
    pd.update(OrderedDict([("f", lib.ones(1)), ("e", lib.ones(1))]))
    assert list(pd) == ["a", "b", "d", "c", "f", "e"] and len(pd) == 6 and "d" in pd and "x" not in pd
    assert isinstance(pd["d"], nn.Parameter) and [n for n, _ in pd.named_parameters()] == list(pd)
    assert tuple(pd.pop("d").shape) == (3,) and "d" not in pd and len(list(pd.parameters())) == 5
    k, v = pd.popitem()
    assert k == "e" and tuple(v.shape) == (1,)
    assert pd.get("zz") is None and pd.get("a") is pd["a"] and pd.setdefault("g", lib.ones(2)) is pd["g"]
    assert list(reversed(pd))[0] == "g" and list(pd.copy()) == list(pd)
    merged = pd | nn.ParameterDict({"h": lib.ones(1)})
    assert list(merged) == list(pd) + ["h"] and "h" not in pd
    assert list(pd.fromkeys(["x", "y"], lib.ones(1))) == ["x", "y"]
    pd["s"] = "a string"
    assert pd["s"] == "a string" and len(list(pd.parameters())) == 5
    del pd["s"]
    pd.clear()
    assert len(pd) == 0 and list(pd.parameters()) == []
  fd, td = fnn.ParameterDict(), T.ParameterDict()
  _same_error(lambda: fd[1], lambda: td[1])
  _same_error(lambda: fd["a"], lambda: td["a"])
  _same_error(lambda: fd.update([("a", fg.ones(2), 1)]), lambda: td.update([("a", torch.ones(2), 1)]))
  _same_error(lambda: fd.update(3), lambda: td.update(3))
  _same_error(lambda: fd(1), lambda: td(1))


# ---- normalization -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size,shape", [(2, (2, 6, 5)), (3, (2, 6, 4, 5)), (5, (1, 7, 3, 2, 2)), (4, (2, 3, 4)),
                                        (1, (2, 3, 4))])
def test_local_response_norm(size, shape, rng):
  fm, tm = _build("LocalResponseNorm", size, 0.3, 0.7, 1.5)
  _compare(fm, tm, [(rng.standard_normal(shape) * 2).astype(np.float32)], rng)


def test_local_response_norm_errors(rng):
  a = rng.standard_normal((3, 4)).astype(np.float32)
  _same_error(lambda: fnn.LocalResponseNorm(2)(fg.tensor(a)), lambda: T.LocalResponseNorm(2)(torch.tensor(a)))
  assert tuple(fnn.LocalResponseNorm(2)(fg.zeros(0, 4, 3)).shape) == (0, 4, 3)
  _same_error(lambda: fnn.CrossMapLRN2d(3)(fg.tensor(a[None])), lambda: T.CrossMapLRN2d(3)(torch.tensor(a[None])))


@pytest.mark.parametrize("C,size", [(8, 5), (3, 5), (6, 2), (5, 3)])
def test_cross_map_lrn2d(C, size, rng):
  fm, tm = _build("CrossMapLRN2d", size, 0.2, 0.75, 1.0)
  x = rng.standard_normal((2, C, 3, 2)).astype(np.float32)
  np.testing.assert_allclose(fm(fg.tensor(x)).numpy(), tm(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
  # gradient: the forward's own (torch's hand-written backward is not), checked by central differences in float64
  x64 = rng.standard_normal((1, C, 2, 1))
  w = rng.standard_normal(x64.shape)
  fx = fg.tensor(x64, requires_grad=True)
  (fm(fx) * fg.tensor(w)).sum().backward()
  num, h = np.zeros_like(x64), 1e-6
  with torch.no_grad():
    for i in np.ndindex(x64.shape):
      a, b = x64.copy(), x64.copy()
      a[i] += h; b[i] -= h
      num[i] = ((tm(torch.tensor(a)) - tm(torch.tensor(b))).numpy() * w).sum() / (2 * h)
  np.testing.assert_allclose(fx.grad.numpy(), num, rtol=1e-5, atol=1e-8)


# ---- dropouts ------------------------------------------------------------------------------------------------------

def test_alpha_dropout_statistics(rng):
  p = 0.2
  alpha = 1.7580993408473766
  a = 1 / math.sqrt((alpha ** 2 * p + 1) * (1 - p))
  x = rng.standard_normal(200000).astype(np.float32)
  fx = fg.tensor(x, requires_grad=True)
  m = fnn.AlphaDropout(p)
  y = m(fx)
  y.sum().backward()
  yn, g = y.numpy(), fx.grad.numpy()
  dropped = np.isclose(yn, alpha * a * (p - 1), rtol=0, atol=1e-6) & (g == 0)
  kept = g != 0
  assert (dropped | kept).all() and abs(dropped.mean() - p) < 0.01
  np.testing.assert_allclose(yn[kept], a * x[kept] + alpha * a * p, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g[kept], a, rtol=1e-6)
  assert abs(yn.mean()) < 0.02 and abs(yn.std() - 1) < 0.02      # a N(0, 1) input keeps its mean and variance
  t = torch.nn.AlphaDropout(p)(torch.tensor(x)).numpy()
  assert abs(t.mean() - yn.mean()) < 0.02 and abs(t.std() - yn.std()) < 0.02
  m.eval()
  np.testing.assert_array_equal(m(fg.tensor(x)).numpy(), x)
  assert (FF.alpha_dropout(fg.tensor(x), 1.0, True).numpy() == 0).all()
  np.testing.assert_array_equal(FF.alpha_dropout(fg.tensor(x), 0.5).numpy(), x)   # training=False by default


def test_feature_alpha_dropout(rng):
  p, alpha = 0.3, 1.7580993408473766
  a = 1 / math.sqrt((alpha ** 2 * p + 1) * (1 - p))
  x = rng.standard_normal((40, 50, 3, 2)).astype(np.float32)
  y = fnn.FeatureAlphaDropout(p)(fg.tensor(x)).numpy()
  kept = np.isclose(y, a * x + alpha * a * p, rtol=1e-5, atol=1e-6)
  dropped = np.isclose(y, alpha * a * (p - 1), rtol=0, atol=1e-6)
  per_channel = kept.reshape(40, 50, -1)
  assert (per_channel.all(-1) | dropped.reshape(40, 50, -1).all(-1)).all()     # whole channels
  assert abs(1 - per_channel.all(-1).mean() - p) < 0.05
  m = fnn.FeatureAlphaDropout(p).eval()
  np.testing.assert_array_equal(m(fg.tensor(x)).numpy(), x)
  _same_error(lambda: FF.feature_alpha_dropout(fg.randn(3), 0.5, True),
              lambda: TF.feature_alpha_dropout(torch.randn(3), 0.5, True))


@pytest.mark.parametrize("name,shape", [("Dropout1d", (30, 40, 5)), ("Dropout1d", (600, 4)),
                                        ("Dropout2d", (30, 40, 2, 3)), ("Dropout2d", (30, 40, 5)),
                                        ("Dropout3d", (20, 30, 2, 2, 2)), ("Dropout3d", (400, 2, 3, 2))])
def test_channel_dropout(name, shape, rng):
  p = 0.25
  x = (rng.random(shape) + 0.5).astype(np.float32)
  fx = fg.tensor(x, requires_grad=True)
  m = getattr(fnn, name)(p)
  warnings.simplefilter("ignore")      # (dropout2d warns of a 3-D input, as torch's; pytest restores the filters)
  y = m(fx)
  (y * 1.0).sum().backward()
  yn, g = y.numpy(), fx.grad.numpy()
  unbatched = (name == "Dropout1d" and len(shape) == 2) or (name == "Dropout3d" and len(shape) == 4)
  ch = yn.reshape(((1, shape[0]) if unbatched else shape[:2]) + (-1,))    # [N, C, rest]
  x3 = x.reshape(ch.shape)
  zero = (ch == 0).all(-1)
  kept = np.isclose(ch, x3 / (1 - p), rtol=1e-6).all(-1)
  assert (zero | kept).all() and abs(zero.mean() - p) < 4 * math.sqrt(p * (1 - p) / zero.size)
  want = np.where(zero[..., None], 0, 1 / (1 - p)) * np.ones_like(ch)
  np.testing.assert_allclose(g.reshape(ch.shape), want, rtol=1e-6)
  m.eval()
  np.testing.assert_array_equal(m(fg.tensor(x)).numpy(), x)


def test_dropout_errors_and_warnings(rng):
  for name in ("AlphaDropout", "FeatureAlphaDropout", "Dropout1d", "Dropout2d", "Dropout3d"):
    for p in (-0.1, 1.2): _same_error(lambda: getattr(fnn, name)(p), lambda: getattr(T, name)(p))
  _same_error(lambda: fnn.Dropout1d()(fg.randn(2, 3, 4, 5)), lambda: T.Dropout1d()(torch.randn(2, 3, 4, 5)))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _same_error(lambda: fnn.Dropout2d()(fg.randn(3)), lambda: T.Dropout2d()(torch.randn(3)))
  for name, shape in (("Dropout2d", (2, 3, 4)), ("Dropout2d", (2, 3)), ("Dropout3d", (2, 3, 4))):
    for mod, lib in ((fnn, fg), (T, torch)):
      with pytest.warns(UserWarning, match=name.lower()): getattr(mod, name)()(lib.randn(*shape))
  assert (FF.dropout2d(fg.ones(4, 5, 2, 2), 1.0).numpy() == 0).all()


# ---- weight_norm / spectral_norm -----------------------------------------------------------------------------------

def _wn_pair(kind, dim, api):
  fm, tm = (fnn.Linear(3, 5), T.Linear(3, 5)) if kind == "linear" else (fnn.Conv2d(3, 4, 3), T.Conv2d(3, 4, 3))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    if api == "hook": fnn.utils.weight_norm(fm, dim=dim); T.utils.weight_norm(tm, dim=dim)
    else: fnn.utils.parametrizations.weight_norm(fm, dim=dim); T.utils.parametrizations.weight_norm(tm, dim=dim)
  return fm, tm


@pytest.mark.parametrize("api", ["hook", "parametrization"])
@pytest.mark.parametrize("kind,dim", [("linear", 0), ("linear", 1), ("conv", 0), ("conv", None), ("conv", 2)])
def test_weight_norm(api, kind, dim, rng):
  fm, tm = _wn_pair(kind, dim, api)
  # g starts as the norm of the module's own weight: the weight is unchanged by the reparametrization
  pw = fm.parametrizations.weight if api != "hook" else None
  w, g = (fm.weight_v, fm.weight_g) if api == "hook" else (pw.original1, pw.original0)
  np.testing.assert_allclose(fm.weight.numpy(), w.numpy(), rtol=1e-5, atol=1e-7)
  _randomize(tm, rng)
  x = rng.standard_normal((2, 3) if kind == "linear" else (2, 3, 5, 5)).astype(np.float32)
  _compare(fm, tm, [x], rng, rtol=1e-5, atol=1e-5)
  assert repr(fm) == repr(tm)
  # a step on g and v changes the weight seen by the next forward
  with fg.no_grad(): g.mul_(2.0)
  y2 = fm(fg.tensor(x))
  with torch.no_grad():
    (tm.weight_g if api == "hook" else tm.parametrizations.weight.original0).mul_(2.0)
  np.testing.assert_allclose(y2.numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_weight_norm_remove_and_errors(rng):
  fm, tm = _wn_pair("linear", 0, "hook")
  _load(fm, tm)
  fnn.utils.remove_weight_norm(fm); T.utils.remove_weight_norm(tm)
  assert list(fm.state_dict()) == list(tm.state_dict()) == ["bias", "weight"] and isinstance(fm.weight, fnn.Parameter)
  np.testing.assert_allclose(fm.weight.numpy(), tm.weight.detach().numpy(), rtol=1e-6)
  _same_error(lambda: fnn.utils.remove_weight_norm(fm), lambda: T.utils.remove_weight_norm(tm))
  with pytest.warns(FutureWarning): fnn.utils.weight_norm(fm)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    T.utils.weight_norm(tm)
    _same_error(lambda: fnn.utils.weight_norm(fm), lambda: T.utils.weight_norm(tm))
  fm, tm = _wn_pair("conv", 0, "parametrization")
  _load(fm, tm)
  P, TP = fnn.utils.parametrize, T.utils.parametrize
  assert P.is_parametrized(fm) and P.is_parametrized(fm, "weight") and not P.is_parametrized(fm, "bias")
  assert P.type_before_parametrizations(fm) is fnn.Conv2d
  with P.cached():
    assert fm.weight is fm.weight
  assert fm.weight is not fm.weight
  P.remove_parametrizations(fm, "weight"); TP.remove_parametrizations(tm, "weight")
  assert type(fm) is fnn.Conv2d and list(fm.state_dict()) == list(tm.state_dict()) == ["bias", "weight"]
  np.testing.assert_allclose(fm.weight.numpy(), tm.weight.detach().numpy(), rtol=1e-5, atol=1e-7)
  _same_error(lambda: P.remove_parametrizations(fm, "weight"), lambda: TP.remove_parametrizations(tm, "weight"))
  _same_error(lambda: fnn.utils.parametrizations.weight_norm(fm, "foo"),
              lambda: T.utils.parametrizations.weight_norm(tm, "foo"))


def test_weight_norm_old_state_dict_loads_into_parametrization(rng):
  _, old = _wn_pair("linear", 0, "hook")
  _randomize(old, rng)
  fm = fnn.utils.parametrizations.weight_norm(fnn.Linear(3, 5))
  fm.load_state_dict({k: fg.tensor(v) for k, v in _np_state(old).items()})
  x = rng.standard_normal((4, 3)).astype(np.float32)
  np.testing.assert_allclose(fm(fg.tensor(x)).numpy(), old(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_parametrize_custom(rng):
  # a user parametrization (symmetric weights) with a right_inverse: assignment goes through it, as torch's
  def make(nn):
    class Symmetric(nn.Module):
      def forward(self, X): return X.triu() + X.triu(1).transpose(-1, -2)
      def right_inverse(self, A): return A.triu()
    m = nn.Linear(4, 4)
    nn.utils.parametrize.register_parametrization(m, "weight", Symmetric())
    return m
  fm, tm = make(fnn), make(T)
  assert list(fm.state_dict()) == list(tm.state_dict()) == ["bias", "parametrizations.weight.original"]
  _randomize(tm, rng)
  _compare(fm, tm, [rng.standard_normal((3, 4)).astype(np.float32)], rng)
  w = fm.weight.numpy()
  np.testing.assert_array_equal(w, w.T)
  a = rng.standard_normal((4, 4)).astype(np.float32)
  a = a + a.T
  fm.weight = fg.tensor(a)
  np.testing.assert_allclose(fm.weight.numpy(), a, rtol=1e-6)


def _sn_pair(api, kind, rng):
  fm, tm = _build("Linear", 6, 5) if kind == "linear" else _build("ConvTranspose2d", 3, 4, 2)
  if api == "hook": fnn.utils.spectral_norm(fm); T.utils.spectral_norm(tm)
  else: fnn.utils.parametrizations.spectral_norm(fm); T.utils.parametrizations.spectral_norm(tm)
  return fm, tm


@pytest.mark.parametrize("api", ["hook", "parametrization"])
@pytest.mark.parametrize("kind", ["linear", "convT"])
def test_spectral_norm(api, kind, rng):
  fm, tm = _sn_pair(api, kind, rng)
  keys = ["bias", "weight_orig", "weight_u", "weight_v"] if api == "hook" else \
      ["bias", "parametrizations.weight.original", "parametrizations.weight.0._u", "parametrizations.weight.0._v"]
  assert list(fm.state_dict()) == list(tm.state_dict()) == keys
  # fusegrad's own u, v: unit vectors; after 15 power iterations sigma is near the largest singular value
  if api == "parametrization":
    u = fm.parametrizations.weight[0]._u.numpy()
    assert abs(np.linalg.norm(u) - 1) < 1e-5
    wm = fm.parametrizations.weight.original.numpy()
    wm = (wm if kind == "linear" else wm.transpose(1, 0, 2, 3)).reshape(wm.shape[0 if kind == "linear" else 1], -1)
    s = np.linalg.svd(wm, compute_uv=False)[0]
    assert np.abs(fm.weight.numpy()).max() * s == pytest.approx(np.abs(wm).max(), rel=0.05)
  x = rng.standard_normal((2, 6) if kind == "linear" else (2, 3, 3, 3)).astype(np.float32)
  _compare(fm, tm, [x], rng, rtol=1e-5, atol=1e-5)                 # training: one power-iteration step, same u, v
  for _ in range(2):                                                # steps keep matching (the buffers updated in place)
    np.testing.assert_allclose(fm(fg.tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)
  fs, ts = fm.state_dict(), tm.state_dict()
  for k in keys: np.testing.assert_allclose(fs[k].numpy(), ts[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
  fm.eval(); tm.eval()
  u0 = fm.state_dict()[keys[2]].numpy().copy()
  np.testing.assert_allclose(fm(fg.tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(fm.state_dict()[keys[2]].numpy(), u0)   # eval: no iteration


def test_spectral_norm_remove_and_errors(rng):
  fm, tm = _sn_pair("hook", "linear", rng)
  _load(fm, tm)
  sd = _np_state(tm)
  fnn.utils.remove_spectral_norm(fm); T.utils.remove_spectral_norm(tm)
  assert list(fm.state_dict()) == list(tm.state_dict()) == ["bias", "weight"]
  # the kept weight is weight_orig / (u . weight_orig v) with the stored u, v, no power iteration: u and v are random
  # unit vectors at first, so sigma can be near 0 and float32's rounding of it large relative to it (8.6e-5 once,
  # seed 3972063538). Against float64, within float32 rounding of its terms relative to sigma, like torch's own.
  W, u, v = (sd[k].astype(np.float64) for k in ("weight_orig", "weight_u", "weight_v"))
  sigma = u @ W @ v
  rtol = 1e-5 + 4e-7 * (np.abs(u) @ np.abs(W) @ np.abs(v)) / abs(sigma) * W.shape[1]
  for got in (fm.weight.numpy(), tm.weight.detach().numpy()):
    np.testing.assert_allclose(got, W / sigma, rtol=rtol, atol=1e-6)
  _same_error(lambda: fnn.utils.remove_spectral_norm(fm), lambda: T.utils.remove_spectral_norm(tm))
  _same_error(lambda: fnn.utils.spectral_norm(fnn.Linear(2, 3), n_power_iterations=0),
              lambda: T.utils.spectral_norm(T.Linear(2, 3), n_power_iterations=0))
  _same_error(lambda: fnn.utils.parametrizations.spectral_norm(fnn.Linear(2, 3), dim=2),
              lambda: T.utils.parametrizations.spectral_norm(T.Linear(2, 3), dim=2))


# ---- laziness ------------------------------------------------------------------------------------------------------

_LAZY = [(lambda: fnn.PReLU(3), (2, 3, 4)), (lambda: fnn.RReLU(), (2, 3)), (lambda: fnn.Softshrink(), (2, 3)),
         (lambda: fnn.Threshold(0.1, 2.0), (2, 3)), (lambda: fnn.ReflectionPad2d(1), (2, 3, 4, 4)),
         (lambda: fnn.CircularPad1d(2), (2, 3, 4)), (lambda: fnn.ChannelShuffle(2), (2, 4, 3)),
         (lambda: fnn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 3, 3)),
         (lambda: fnn.LocalResponseNorm(3), (2, 5, 3)),
         (lambda: fnn.CrossMapLRN2d(3), (2, 5, 3, 3)), (lambda: fnn.AlphaDropout(0.3), (4, 5)),
         (lambda: fnn.Dropout2d(0.3), (2, 3, 4, 4)),
         (lambda: fnn.utils.parametrizations.weight_norm(fnn.Linear(3, 4)), (2, 3)),
         (lambda: fnn.utils.parametrizations.spectral_norm(fnn.Linear(3, 4)), (2, 3)),
         (lambda: fnn.utils.spectral_norm(fnn.Linear(3, 4)), (2, 3))]


@pytest.mark.parametrize("i", range(len(_LAZY)))
def test_forward_is_lazy(i, rng):
  """A forward pass only records graph (no kernel runs, nothing read on the host) and is differentiable."""
  build, shape = _LAZY[i]
  m = build()
  fg.realize(*m.parameters(), *m.buffers())
  x = fg.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True).realize()
  reads = host_reads[0]
  with fg.track() as t:
    y = m(x)
  assert len(t.kernels) == 0 and not y.node.realized
  # (a random draw counts as host code: it advances the generator's counter)
  assert host_reads[0] == reads or isinstance(m, (fnn.RReLU, fnn.AlphaDropout, fnn.Dropout2d))
  y.sum().backward()
  assert x.grad is not None and np.isfinite(x.grad.numpy()).all()


def test_bilinear_and_embedding_bag_are_lazy(rng):
  b = fnn.Bilinear(3, 4, 2)
  bag = fnn.EmbeddingBag(10, 3, mode="max")
  fg.realize(*b.parameters(), *bag.parameters())
  x1, x2 = fg.randn(2, 3).realize(), fg.randn(2, 4).realize()
  idx, off = fg.tensor(rng.integers(0, 10, 7)).realize(), fg.tensor([0, 2, 2, 5]).realize()
  reads = host_reads[0]
  with fg.track() as t:
    y1 = b(x1, x2)
    assert host_reads[0] == reads
    y2 = bag(idx, off)     # (reads its realized indices to check their range, as nn.Embedding does: no kernel)
  assert len(t.kernels) == 0 and not y1.node.realized and not y2.node.realized
