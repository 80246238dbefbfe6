"""nn.Transformer and its parts against torch.nn, with the same weights (copied through state_dict).

Ours runs in float32, torch in float64 as the reference. Both run in training mode with dropout=0, which keeps
torch off its fast path (that path zeroes padded positions of nested tensors, a difference we do not copy).
"""
from __future__ import annotations
import copy
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as fnn
from conftest import DEVICES

E, H, FF = 8, 2, 16          # d_model, nhead, dim_feedforward
N, S, T = 2, 5, 4            # batch, source length, target length
RTOL, ATOL = 1e-4, 1e-4
# torch's notes on its own fast path and on masks of mixed types (which both libraries accept)
pytestmark = [pytest.mark.filterwarnings("ignore:enable_nested_tensor is True"),
              pytest.mark.filterwarnings("ignore:Support for mismatched")]


# ---- helpers ----------------------------------------------------------------------------------------------------

def randomize(m: fnn.Module, rng, device) -> None:
  """random parameters (LayerNorm weights near 1) through load_state_dict"""
  sd = {}
  for k, v in m.state_dict().items():
    lo, hi = (0.5, 1.5) if k.split(".")[-2].startswith("norm") and k.endswith("weight") else (-0.5, 0.5)
    sd[k] = fg.tensor(rng.uniform(lo, hi, v.shape).astype(np.float32), device=device)
  m.load_state_dict(sd)


def pair(build, rng, device):
  """ours (random weights, on device) and torch's from the same constructor call, with our weights in float64"""
  ours = build(fnn).to(device)
  randomize(ours, rng, device)
  theirs = build(torch.nn)
  assert list(ours.state_dict()) == list(theirs.state_dict()), "state_dict keys"
  theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
  return ours, theirs.double()


def seq(rng, L, batch_first, unbatched=False) -> np.ndarray:
  shape = (L, E) if unbatched else ((N, L, E) if batch_first else (L, N, E))
  return rng.standard_normal(shape).astype(np.float32)


def conv(a, device, requires_grad=False):
  """(ours, torch's) of a numpy array; None stays None"""
  if a is None: return None, None
  if a.dtype == bool: return fg.tensor(a, device=device), torch.tensor(a)
  return (fg.tensor(a, device=device, requires_grad=requires_grad),
          torch.tensor(a, dtype=torch.float64, requires_grad=requires_grad))


def close(got: fg.Tensor, want: torch.Tensor, label: str) -> None:
  assert got is not None, f"{label}: None"
  g, w = got.numpy(), want.detach().numpy()
  assert g.shape == w.shape, f"{label}: shape {g.shape}, torch {w.shape}"
  np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(w).max())), err_msg=label)


def attn_mask(rng, kind, L, Sk, batched=True):
  """a mask of the given kind for L queries over Sk keys (None for kind None)"""
  if kind is None: return None
  if kind == "causal_float": return np.triu(np.full((L, Sk), -np.inf, np.float32), 1)
  if kind == "causal_bool": return np.triu(np.ones((L, Sk), bool), 1)
  if kind == "bool":
    m = rng.random((L, Sk)) < 0.4
    m[:, 0] = False                      # no row fully masked (softmax of all -inf is NaN in both)
    return m
  if kind == "bool3d":
    m = rng.random(((N if batched else 1) * H, L, Sk)) < 0.4
    m[..., 0] = False
    return m
  if kind == "float": return rng.standard_normal((L, Sk)).astype(np.float32)
  raise ValueError(kind)


def padding_mask(rng, kind, Sk, unbatched=False):
  if kind is None: return None
  shape = (Sk,) if unbatched else (N, Sk)
  if kind == "bool":
    m = rng.random(shape) < 0.4
    m[..., 0] = False
    return m
  if kind == "float": return rng.standard_normal(shape).astype(np.float32)
  raise ValueError(kind)


# ---- TransformerEncoderLayer ------------------------------------------------------------------------------------

# (norm_first, batch_first, activation, attn mask kind, key padding mask kind, is_causal, unbatched)
ENC = [
  (False, False, "relu", None, None, False, False),
  (True, True, "gelu", None, None, False, False),
  (False, True, "gelu", "causal_float", None, True, False),
  (True, False, "relu", "causal_bool", "bool", False, False),
  (False, True, "relu", "bool", "bool", False, False),
  (True, True, "relu", "float", "bool", False, False),
  (False, False, "gelu", "bool3d", None, False, False),
  (True, False, "gelu", None, "float", False, False),
  (False, True, "relu", None, None, True, False),        # is_causal alone: a causal mask (torch: the hint needs a mask)
  (True, True, "relu", "causal_float", "bool", False, True),
  (False, False, "gelu", "bool3d", None, False, True),
]


@pytest.mark.parametrize("norm_first,batch_first,act,mask,kpm,causal,unbatched", ENC,
                         ids=["-".join(map(str, c)) for c in ENC])
def test_encoder_layer(norm_first, batch_first, act, mask, kpm, causal, unbatched, device, rng):
  build = lambda L: L.TransformerEncoderLayer(E, H, FF, dropout=0.0, activation=act, batch_first=batch_first,
                                              norm_first=norm_first)
  ours, theirs = pair(build, rng, device)
  fx, tx = conv(seq(rng, S, batch_first, unbatched), device)
  fm, tm = conv(attn_mask(rng, mask, S, S, batched=not unbatched), device)
  fk, tk = conv(padding_mask(rng, kpm, S, unbatched), device)
  if causal and tm is None:
    tm = torch.nn.Transformer.generate_square_subsequent_mask(S, dtype=torch.float64)
  y = ours(fx, src_mask=fm, src_key_padding_mask=fk, is_causal=causal)
  close(y, theirs(tx, src_mask=tm, src_key_padding_mask=tk, is_causal=causal), "output")
  assert y.dtype == fg.float32 and y.device == device


def test_encoder_layer_callable_activation(rng):
  # a Module activation is a submodule in both (no parameters, so the state_dicts still match)
  for act in (lambda L: L.GELU(approximate="tanh"), lambda L: L.functional.silu):
    build = lambda L: L.TransformerEncoderLayer(E, H, FF, dropout=0.0, activation=act(L), batch_first=True)
    ours, theirs = pair(build, rng, "CPU")
    fx, tx = conv(seq(rng, S, True), "CPU")
    close(ours(fx), theirs(tx), "output")
  assert fnn.TransformerEncoderLayer(E, H, activation="gelu").activation_relu_or_gelu == 2
  with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
    fnn.TransformerEncoderLayer(E, H, activation="tanh")


# ---- TransformerDecoderLayer ------------------------------------------------------------------------------------

# (norm_first, batch_first, activation, tgt mask, memory mask, tgt kpm, memory kpm, unbatched)
DEC = [
  (False, False, "relu", "causal_float", None, None, None, False),
  (True, True, "gelu", "causal_bool", None, "bool", "bool", False),
  (False, True, "gelu", "causal_float", "float", None, "bool", False),
  (True, False, "relu", None, "bool", "float", None, False),
  (False, True, "relu", "bool3d", "bool3d", None, None, False),
  (True, True, "relu", "causal_float", None, "bool", "bool", True),
]


@pytest.mark.parametrize("norm_first,batch_first,act,tmask,mmask,tkpm,mkpm,unbatched", DEC,
                         ids=["-".join(map(str, c)) for c in DEC])
def test_decoder_layer(norm_first, batch_first, act, tmask, mmask, tkpm, mkpm, unbatched, device, rng):
  build = lambda L: L.TransformerDecoderLayer(E, H, FF, dropout=0.0, activation=act, batch_first=batch_first,
                                              norm_first=norm_first)
  ours, theirs = pair(build, rng, device)
  fx, tx = conv(seq(rng, T, batch_first, unbatched), device)
  fmem, tmem = conv(seq(rng, S, batch_first, unbatched), device)
  kw = {"tgt_mask": attn_mask(rng, tmask, T, T, not unbatched), "memory_mask": attn_mask(rng, mmask, T, S, not unbatched),
        "tgt_key_padding_mask": padding_mask(rng, tkpm, T, unbatched),
        "memory_key_padding_mask": padding_mask(rng, mkpm, S, unbatched)}
  fkw, tkw = {}, {}
  for k, v in kw.items(): fkw[k], tkw[k] = conv(v, device)
  causal = tmask is not None and tmask.startswith("causal")
  y = ours(fx, fmem, tgt_is_causal=causal, **fkw)
  close(y, theirs(tx, tmem, tgt_is_causal=causal, **tkw), "output")


# ---- stacks -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_first,batch_first", [(False, False), (True, True)])
def test_encoder_and_decoder_stacks(norm_first, batch_first, device, rng):
  def enc(L):
    layer = L.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    return L.TransformerEncoder(layer, 2, norm=L.LayerNorm(E), enable_nested_tensor=False)
  def dec(L):
    layer = L.TransformerDecoderLayer(E, H, FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    return L.TransformerDecoder(layer, 2, norm=L.LayerNorm(E))
  oe, te = pair(enc, rng, device)
  od, td = pair(dec, rng, device)
  assert "layers.1.self_attn.in_proj_weight" in oe.state_dict() and "norm.weight" in oe.state_dict()
  assert "layers.1.multihead_attn.out_proj.weight" in od.state_dict() and "layers.0.norm3.bias" in od.state_dict()
  fx, tx = conv(seq(rng, S, batch_first), device)
  fk, tk = conv(padding_mask(rng, "bool", S), device)
  fmem, tmem = oe(fx, src_key_padding_mask=fk), te(tx, src_key_padding_mask=tk)
  close(fmem, tmem, "encoder output")
  fy, ty = conv(seq(rng, T, batch_first), device)
  fm = fnn.Transformer.generate_square_subsequent_mask(T, device=device)
  tm = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
  close(od(fy, fmem, tgt_mask=fm, memory_key_padding_mask=fk, tgt_is_causal=True),
        td(ty, tmem, tgt_mask=tm, memory_key_padding_mask=tk, tgt_is_causal=True), "decoder output")


def test_stacks_deep_copy_the_layer(rng):
  # as torch: every layer starts as a copy of the one given, and the copies are independent parameters
  layer = fnn.TransformerEncoderLayer(E, H, FF)
  enc = fnn.TransformerEncoder(layer, 3)
  assert enc.num_layers == 3 and len(enc.layers) == 3 and enc.norm is None
  ps = [dict(m.named_parameters()) for m in (layer, *enc.layers)]
  for k in ps[0]:
    assert len({id(p[k]) for p in ps}) == 4, k
    for p in ps[1:]: np.testing.assert_array_equal(p[k].numpy(), ps[0][k].numpy(), err_msg=k)
    assert all(p[k].requires_grad and isinstance(p[k], fnn.Parameter) for p in ps[1:])
  # writing one copy (in place, and through load_state_dict) leaves the others and the original alone
  w0 = layer.linear1.weight.numpy().copy()
  with fg.no_grad(): enc.layers[0].linear1.weight.add_(1.0)
  sd = layer.state_dict()
  sd["linear1.weight"] = fg.tensor(rng.standard_normal((FF, E)).astype(np.float32))
  enc.layers[1].load_state_dict(sd)
  np.testing.assert_array_equal(layer.linear1.weight.numpy(), w0)
  np.testing.assert_array_equal(enc.layers[2].linear1.weight.numpy(), w0)
  np.testing.assert_allclose(enc.layers[0].linear1.weight.numpy(), w0 + 1.0)
  np.testing.assert_array_equal(enc.layers[1].linear1.weight.numpy(), sd["linear1.weight"].numpy())


def test_deepcopy_of_tensors():
  x = fg.tensor([1.0, 2.0], requires_grad=True)
  x.grad = fg.tensor([3.0, 4.0])
  y = copy.deepcopy(x)
  assert y is not x and y.requires_grad and y.is_leaf and y.grad is not x.grad
  np.testing.assert_array_equal(y.numpy(), [1.0, 2.0])
  np.testing.assert_array_equal(y.grad.numpy(), [3.0, 4.0])
  a, b = copy.deepcopy([x, x])
  assert a is b                                  # the memo keeps shared tensors shared
  with pytest.raises(RuntimeError, match="graph leaves"): copy.deepcopy(x * 2)


# ---- Transformer ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_first,batch_first,act,unbatched", [(False, False, "relu", False),
                                                                   (True, True, "gelu", False),
                                                                   (False, True, "gelu", True)])
def test_transformer(norm_first, batch_first, act, unbatched, device, rng):
  build = lambda L: L.Transformer(E, H, 2, 1, FF, dropout=0.0, activation=act, batch_first=batch_first,
                                  norm_first=norm_first)
  ours, theirs = pair(build, rng, device)
  fs, ts = conv(seq(rng, S, batch_first, unbatched), device)
  ft, tt = conv(seq(rng, T, batch_first, unbatched), device)
  fm = fnn.Transformer.generate_square_subsequent_mask(T, device=device)
  tm = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
  fk, tk = conv(padding_mask(rng, "bool", S, unbatched), device)
  fq, tq = conv(padding_mask(rng, "bool", T, unbatched), device)
  y = ours(fs, ft, tgt_mask=fm, src_key_padding_mask=fk, tgt_key_padding_mask=fq, memory_key_padding_mask=fk,
           tgt_is_causal=True)
  close(y, theirs(ts, tt, tgt_mask=tm, src_key_padding_mask=tk, tgt_key_padding_mask=tq,
                  memory_key_padding_mask=tk, tgt_is_causal=True), "output")
  assert y.shape == tuple(tt.shape)


# both orders on the CPU and the interpreter; OPENCL (a minute of PoCL compiling on a cold cache) runs one
@pytest.mark.parametrize("norm_first,device", [(nf, d) for nf in (False, True) for d in DEVICES
                                               if d != "OPENCL" or not nf])
def test_transformer_gradients(norm_first, device, rng):
  """backward of sum(out * g): the gradients of src, tgt and every parameter, with masks on both sides"""
  build = lambda L: L.Transformer(E, H, 1, 1, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
  ours, theirs = pair(build, rng, device)
  fs, ts = conv(seq(rng, S, True), device, requires_grad=True)
  ft, tt = conv(seq(rng, T, True), device, requires_grad=True)
  fm, tm = conv(attn_mask(rng, "causal_bool", T, T), device)
  fk, tk = conv(padding_mask(rng, "bool", S), device)
  fy = ours(fs, ft, tgt_mask=fm, src_key_padding_mask=fk, memory_key_padding_mask=fk)
  ty = theirs(ts, tt, tgt_mask=tm, src_key_padding_mask=tk, memory_key_padding_mask=tk)
  close(fy, ty, "output")
  g = rng.standard_normal(fy.shape).astype(np.float32)
  (fy * fg.tensor(g, device=device)).sum().backward()
  (ty * torch.tensor(g, dtype=torch.float64)).sum().backward()
  close(fs.grad, ts.grad, "src grad")
  close(ft.grad, tt.grad, "tgt grad")
  tp = dict(theirs.named_parameters())
  fp = dict(ours.named_parameters())
  assert list(fp) == list(tp)
  for k, p in fp.items(): close(p.grad, tp[k].grad, f"grad of {k}")


def test_transformer_eval_and_dropout(rng):
  build = lambda L, p: L.Transformer(E, H, 1, 1, FF, dropout=p, batch_first=True)
  ours = build(fnn, 0.5)
  theirs = build(torch.nn, 0.0)
  theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
  theirs.double()
  src, tgt = seq(rng, S, True), seq(rng, T, True)
  want = theirs(torch.tensor(src, dtype=torch.float64), torch.tensor(tgt, dtype=torch.float64))
  ours.eval()                                     # dropout off
  close(ours(fg.tensor(src), fg.tensor(tgt)), want, "eval output")
  ours.train()
  got = ours(fg.tensor(src), fg.tensor(tgt)).numpy()
  assert np.all(np.isfinite(got)) and not np.allclose(got, want.detach().numpy(), atol=1e-2)


def test_transformer_init_and_custom_parts():
  m = fnn.Transformer(E, H, 2, 2, FF)
  assert (m.d_model, m.nhead, m.batch_first) == (E, H, False)
  # xavier-uniform for every matrix after the stacks were built: the layers no longer share values
  w0, w1 = (m.encoder.layers[i].linear1.weight.numpy() for i in range(2))
  assert not np.array_equal(w0, w1)
  bound = np.sqrt(6 / (E + FF))
  assert np.abs(w0).max() <= bound and np.abs(w0).max() > bound / 2
  np.testing.assert_array_equal(m.encoder.norm.weight.numpy(), np.ones(E))    # 1-D parameters keep their init
  enc = fnn.TransformerEncoder(fnn.TransformerEncoderLayer(E, H, FF, batch_first=True), 1)
  dec = fnn.TransformerDecoder(fnn.TransformerDecoderLayer(E, H, FF, batch_first=True), 1)
  m = fnn.Transformer(E, H, custom_encoder=enc, custom_decoder=dec, batch_first=True)
  assert m.encoder is enc and m.decoder is dec
  assert sorted({k.split(".")[0] for k in m.state_dict()}) == ["decoder", "encoder"]
  assert m(fg.randn(N, S, E), fg.randn(N, T, E)).shape == (N, T, E)


def test_generate_square_subsequent_mask():
  for kw, tkw in (({}, {}), ({"dtype": fg.float64}, {"dtype": torch.float64})):
    got = fnn.Transformer.generate_square_subsequent_mask(5, **kw)
    want = torch.nn.Transformer.generate_square_subsequent_mask(5, **tkw)
    assert got.dtype == (kw.get("dtype") or fg.float32) and got.shape == (5, 5)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  assert fnn.Transformer.generate_square_subsequent_mask(3, device="PYTHON").device == "PYTHON"


def test_state_dict_from_torch_loads_unchanged(rng):
  theirs = torch.nn.Transformer(E, H, 2, 2, FF, dropout=0.0, batch_first=True)
  ours = fnn.Transformer(E, H, 2, 2, FF, dropout=0.0, batch_first=True)
  ours.load_state_dict({k: fg.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
  src, tgt = seq(rng, S, True), seq(rng, T, True)
  close(ours(fg.tensor(src), fg.tensor(tgt)), theirs.double()(torch.tensor(src).double(), torch.tensor(tgt).double()),
        "output")


# ---- errors -----------------------------------------------------------------------------------------------------

def test_errors():
  with pytest.raises(AssertionError, match=r"embed_dim must be divisible by num_heads \(got embed_dim=10, num_heads=3\)"):
    fnn.TransformerEncoderLayer(10, 3)
  with pytest.raises(AssertionError, match="divisible"): torch.nn.TransformerEncoderLayer(10, 3)
  with pytest.raises(AssertionError, match="embed_dim=10, num_heads=4"): fnn.Transformer(10, 4)
  with pytest.raises(AssertionError, match="embed_dim=6, num_heads=4"): fnn.TransformerDecoderLayer(6, 4)
  layer = fnn.TransformerEncoderLayer(E, H, FF, batch_first=True)
  with pytest.raises(RuntimeError, match=r"d_model=8, got src of shape \[2, 5, 6\]"): layer(fg.zeros(N, S, 6))
  with pytest.raises(RuntimeError, match=r"got src of shape \[8\]"): layer(fg.zeros(E))
  dec = fnn.TransformerDecoderLayer(E, H, FF, batch_first=True)
  with pytest.raises(RuntimeError, match=r"d_model=8, got memory of shape \[2, 5, 4\]"):
    dec(fg.zeros(N, T, E), fg.zeros(N, S, 4))
  with pytest.raises(RuntimeError, match=r"both be batched.*\[4, 8\].*\[2, 5, 8\]"):
    dec(fg.zeros(T, E), fg.zeros(N, S, E))
  m = fnn.Transformer(E, H, 1, 1, FF, batch_first=True)
  with pytest.raises(RuntimeError, match=r"d_model=8 \(src of shape \[2, 5, 8\], tgt of shape \[2, 4, 6\]\)"):
    m(fg.zeros(N, S, E), fg.zeros(N, T, 6))
  with pytest.raises(RuntimeError, match=r"batch number of src and tgt must be equal \(src of shape \[2, 5, 8\], tgt "
                                         r"of shape \[3, 4, 8\]"):
    m(fg.zeros(N, S, E), fg.zeros(3, T, E))
  x = fg.zeros(N, S, E)
  with pytest.raises(AssertionError, match=r"expecting key_padding_mask shape of \[2, 5\], but got \[5, 2\]"):
    layer(x, src_key_padding_mask=fg.zeros(S, N, dtype=fg.bool))
  with pytest.raises(RuntimeError, match=r"2D attn_mask is \[4, 5\], but should be \[5, 5\]"):
    layer(x, src_mask=fg.zeros(4, S))
  with pytest.raises(RuntimeError, match=r"3D attn_mask is \[2, 5, 5\], but should be \[4, 5, 5\]"):
    layer(x, src_mask=fg.zeros(2, S, S))
  with pytest.raises(AssertionError, match="only bool and floating types of attn_mask are supported"):
    layer(x, src_mask=fg.zeros(S, S, dtype=fg.int32))
  with pytest.raises(AssertionError, match="only bool and floating types of key_padding_mask"):
    layer(x, src_key_padding_mask=fg.zeros(N, S, dtype=fg.int64))


# ---- fusion -----------------------------------------------------------------------------------------------------

def test_encoder_layer_kernel_count(rng):
  """one post-norm encoder layer forward, inputs and weights realized: the [3E, E] q/k/v projection (1), scores,
  softmax (2), weights @ v, out_proj, add + norm1, linear1 + relu, linear2, add + norm2. Pinned at the current 10."""
  m = fnn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
  fg.realize(*m.parameters())
  x = fg.tensor(rng.standard_normal((3, 5, 16)).astype(np.float32)).realize()
  with fg.no_grad():
    with fg.track() as t:
      y = m(x).numpy()
  assert len(t.kernels) == 10, [getattr(k, "name", k) for k in t.kernels]
  theirs = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
  theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in m.state_dict().items()})
  with torch.no_grad(): want = theirs.train()(torch.tensor(x.numpy())).numpy()
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
