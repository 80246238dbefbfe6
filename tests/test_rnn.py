"""fusegrad.nn's recurrent layers (RNN, LSTM, GRU and the cells) against torch.nn, with the same weights.

Each case builds the layer with the same constructor call in both libraries, gives ours random weights,
copies them into torch's through load_state_dict (PyTorch's names and shapes) and compares outputs, final
states, and the gradients of the input, the initial states and every parameter (torch in float64, ours in
float32). Sizes are tiny and shared between cases: each time step's kernels differ (they read the input
projection at the step's offset), so small, repeated shapes keep compiling cheap. The full matrix runs on CPU;
a part of it (marked by `on_all`) also on PYTHON and OPENCL.
"""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as fnn
from conftest import DEVICES

T_, N_, I_, H_ = 3, 2, 3, 4
RTOL, ATOL = 1e-5, 2e-5


def with_devices(cases: list, ids, on_python=lambda c: False, on_opencl=lambda c: False,
                 slow=lambda c: False) -> list:
  """cases x CPU, and the cases the predicates pick x PYTHON and OPENCL (OPENCL compiles slowly: few cases)"""
  picks = {"CPU": lambda c: True, "PYTHON": on_python, "OPENCL": on_opencl}
  return [pytest.param(*c, d, id=f"{i}-{d}", marks=[pytest.mark.slow] if slow(c) else [])
          for c, i in zip(cases, ids) for d in DEVICES if picks[d](c)]


def close(got, want, label: str) -> None:
  assert got is not None, f"{label}: is None, torch has a value"
  g = got.numpy() if isinstance(got, fg.Tensor) else np.asarray(got)
  w = want.detach().double().numpy()
  assert g.shape == w.shape, f"{label}: shape {g.shape}, torch {w.shape}"
  np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=label)


def randomize(m: fnn.Module, rng, device: str) -> None:
  m.load_state_dict({k: fg.tensor(rng.uniform(-0.8, 0.8, v.shape).astype(np.float32), device=device)
                     for k, v in m.state_dict().items()})


def twin(ours: fnn.Module, build) -> torch.nn.Module:
  theirs = build(torch.nn)
  theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
  return theirs.double().train(ours.training)


def pair(rng, shape, device):
  a = rng.standard_normal(shape).astype(np.float32)
  return fg.tensor(a, device=device, requires_grad=True), torch.tensor(a, dtype=torch.float64, requires_grad=True)


def flat(y) -> list:
  """output, h_n or output, (h_n, c_n) (or a cell's h / (h, c)) as a flat list"""
  if not isinstance(y, tuple): return [y]
  return [t for v in y for t in (v if isinstance(v, tuple) else (v,))]


def compare(ours, theirs, fargs: list, targs: list, rng) -> None:
  """forward (each returned tensor), then backward of sum(out_i * g_i): grads of every input and parameter"""
  fys, tys = flat(ours(*fargs)), flat(theirs(*targs))
  assert len(fys) == len(tys)
  floss = tloss = 0
  for i, (fy, ty) in enumerate(zip(fys, tys)):
    assert fy.dtype == fg.float32
    close(fy, ty, f"output {i}")
    g = rng.standard_normal(ty.shape).astype(np.float32)
    floss = floss + (fy * fg.tensor(g, device=fy.device)).sum()
    tloss = tloss + (ty * torch.tensor(g, dtype=torch.float64)).sum()
  floss.backward()
  tloss.backward()
  for i, (a, b) in enumerate(zip(flat(tuple(fargs)), flat(tuple(targs)))):
    if b is not None and b.requires_grad: close(a.grad, b.grad, f"grad of argument {i}")
  tparams = dict(theirs.named_parameters())
  fparams = dict(ours.named_parameters())
  assert list(fparams) == list(tparams), "parameter names and order"
  for k, p in fparams.items():
    assert p.grad is not None and p.grad.shape == p.shape and p.grad.device == p.device, k
    close(p.grad, tparams[k].grad, f"grad of {k}")


def build_fn(kind: str, **kw):
  if kind == "RNN_relu": return lambda L: L.RNN(I_, H_, nonlinearity="relu", **kw)
  return lambda L: getattr(L, kind)(I_, H_, **kw)


def states(kind, rng, device, shape, given: bool):
  if not given: return [], []
  if kind != "LSTM":
    f, t = pair(rng, shape, device)
    return [f], [t]
  (fh, th), (fc, tc) = pair(rng, shape, device), pair(rng, shape, device)
  return [(fh, fc)], [(th, tc)]


KINDS = ["RNN", "RNN_relu", "LSTM", "GRU"]
# every option value with every kind, in four combinations (the full product of options took minutes of compiling
# in `make test` and found nothing these do not)
FAST = ((1, False, False, False), (2, True, True, True), (1, True, False, True), (2, False, True, False))
MATRIX = [(k, *f) for k in KINDS for f in FAST]


@pytest.mark.parametrize("kind,num_layers,bidirectional,batch_first,init,device",
                         with_devices(MATRIX, ["-".join(map(str, c)) for c in MATRIX],
                                      on_python=lambda c: c[1:] in ((2, True, True, True), (1, False, False, False)),
                                      on_opencl=lambda c: c == ("LSTM", 1, False, False, False),
                                      slow=lambda c: c[1:] not in FAST))
def test_layer_matches_torch(kind, num_layers, bidirectional, batch_first, init, rng, device):
  build = build_fn(kind, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
  ours = build(fnn).to(device)
  randomize(ours, rng, device)
  theirs = twin(ours, build)
  fx, tx = pair(rng, (N_, T_, I_) if batch_first else (T_, N_, I_), device)
  fh, th = states(kind, rng, device, ((2 if bidirectional else 1) * num_layers, N_, H_), init)
  compare(ours, theirs, [fx, *fh], [tx, *th], rng)


UNBATCHED = [(k, False) for k in KINDS] + [("LSTM", True), ("GRU", True)]


@pytest.mark.parametrize("kind,init,device", with_devices(UNBATCHED, [f"{k}-{i}" for k, i in UNBATCHED],
                                                          on_python=lambda c: c[0] == "LSTM" and c[1]))
def test_unbatched_input(kind, init, rng, device):
  build = build_fn(kind, num_layers=2, bidirectional=True, batch_first=True)
  ours = build(fnn).to(device)
  randomize(ours, rng, device)
  theirs = twin(ours, build)
  fx, tx = pair(rng, (T_, I_), device)
  fh, th = states(kind, rng, device, (4, H_), init)
  compare(ours, theirs, [fx, *fh], [tx, *th], rng)


@pytest.mark.parametrize("bidirectional,device", with_devices([(False,), (True,)], ["uni", "bi"],
                                                                     on_python=lambda c: c[0]))
def test_lstm_proj_size(bidirectional, rng, device):
  build = lambda L: L.LSTM(I_, H_, num_layers=2, bidirectional=bidirectional, proj_size=2)
  ours = build(fnn).to(device)
  assert [tuple(p.shape) for p in ours.parameters()] == [tuple(p.shape) for p in build(torch.nn).parameters()]
  randomize(ours, rng, device)
  theirs = twin(ours, build)
  d = 2 if bidirectional else 1
  fx, tx = pair(rng, (T_, N_, I_), device)
  (fh, th), (fc, tc) = pair(rng, (2 * d, N_, 2), device), pair(rng, (2 * d, N_, H_), device)
  compare(ours, theirs, [fx, (fh, fc)], [tx, (th, tc)], rng)


CELLS = [(c, kw, batched, init) for c, kw in [("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu"}),
                                             ("LSTMCell", {}), ("GRUCell", {}), ("GRUCell", {"bias": False})]
         for batched in (True, False) for init in (False, True)]


@pytest.mark.parametrize("cell,kw,batched,init,device",
                         with_devices(CELLS, [f"{c}-{'-'.join(f'{k}={v}' for k, v in kw.items())}-{b}-{i}"
                                              for c, kw, b, i in CELLS], on_python=lambda c: c[2] and c[3],
                                      on_opencl=lambda c: c[0] == "GRUCell" and c[2] and c[3] and not c[1]))
def test_cell_matches_torch(cell, kw, batched, init, rng, device):
  build = lambda L: getattr(L, cell)(I_, H_, **kw)
  ours = build(fnn).to(device)
  randomize(ours, rng, device)
  theirs = twin(ours, build)
  lead = (N_,) if batched else ()
  fx, tx = pair(rng, lead + (I_,), device)
  fh, th = states("LSTM" if cell == "LSTMCell" else cell, rng, device, lead + (H_,), init)
  compare(ours, theirs, [fx, *fh], [tx, *th], rng)


def test_cell_loop_equals_layer(rng):
  """an LSTMCell stepped by hand over a sequence gives nn.LSTM's output with the same weights"""
  cell, layer = fnn.LSTMCell(I_, H_), fnn.LSTM(I_, H_)
  randomize(layer, rng, "CPU")
  cell.load_state_dict({k[:-3]: v for k, v in layer.state_dict().items()})
  x = fg.tensor(rng.standard_normal((T_, N_, I_)).astype(np.float32))
  h = c = None
  outs = []
  for t in range(T_):
    h, c = cell(x[t], None if h is None else (h, c))
    outs.append(h)
  out, (hn, cn) = layer(x)
  np.testing.assert_allclose(out.numpy(), fg.stack(outs).numpy(), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(cn.numpy()[0], c.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["RNN", "GRU"])
def test_one_step_without_state_gives_zero_weight_hh_grad(kind, rng):
  """W_hh meets only the zero initial state: its gradient is zeros, as torch's, not None"""
  build = lambda L: getattr(L, kind)(I_, H_, bidirectional=True)
  ours = build(fnn)
  randomize(ours, rng, "CPU")
  fx, tx = pair(rng, (1, N_, I_), "CPU")
  compare(ours, twin(ours, build), [fx], [tx], rng)
  assert not np.any(ours.weight_hh_l0.grad.numpy()) and not np.any(ours.weight_hh_l0_reverse.grad.numpy())


@pytest.mark.parametrize("kind,device", with_devices([("LSTM",), ("GRU",)], ["LSTM", "GRU"],
                                                    on_python=lambda c: c[0] == "LSTM"))
def test_dropout_only_in_training(kind, rng, device):
  # eval: dropout > 0 is the same function as dropout 0 (and torch's)
  ours = getattr(fnn, kind)(I_, H_, num_layers=2, dropout=0.5).to(device)
  plain = getattr(fnn, kind)(I_, H_, num_layers=2).to(device)
  randomize(ours, rng, device)
  plain.load_state_dict(ours.state_dict())
  ours.eval()
  theirs = twin(ours, lambda L: getattr(L, kind)(I_, H_, num_layers=2, dropout=0.5))
  x = rng.standard_normal((T_, N_, I_)).astype(np.float32)
  got = flat(ours(fg.tensor(x, device=device)))
  for a, b, c in zip(got, flat(plain(fg.tensor(x, device=device))), flat(theirs(torch.tensor(x, dtype=torch.float64)))):
    # (within rounding: the final states are computed with the next realize, here the first output's, so the two
    # models' kernels fuse differently)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    close(a, c, "eval output")
  # training with p = 1: the second layer sees zeros, as torch's (a deterministic check that dropout is applied
  # between layers, and only there: the first layer's final state is untouched)
  drop1 = lambda L: getattr(L, kind)(I_, H_, num_layers=2, dropout=1.0)
  ours1 = drop1(fnn).to(device)
  ours1.load_state_dict(ours.state_dict())
  theirs1 = twin(ours1, drop1)
  for i, (a, b) in enumerate(zip(flat(ours1(fg.tensor(x, device=device))),
                                 flat(theirs1(torch.tensor(x, dtype=torch.float64))))):
    close(a, b, f"training output {i} with dropout=1")
  # training with p = 0.5 differs from eval
  ours.train()
  assert not np.allclose(ours(fg.tensor(x, device=device))[0].numpy(), got[0].numpy())


@pytest.mark.parametrize("build", [
  lambda L: L.RNN(5, 3, 2, "relu", False, True, 0.0, True),
  lambda L: L.LSTM(5, 3, 2, True, False, 0.25, True, 2),
  lambda L: L.GRU(5, 3, bias=False, bidirectional=True),
  lambda L: L.RNNCell(5, 3, nonlinearity="relu"),
  lambda L: L.LSTMCell(5, 3, bias=False),
  lambda L: L.GRUCell(5, 3),
])
def test_names_shapes_init_repr(build):
  ours, theirs = build(fnn), build(torch.nn)
  assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
         [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
  assert repr(ours) == repr(theirs)
  for attr in ("input_size", "hidden_size", "bias", "num_layers", "batch_first", "dropout", "bidirectional",
               "proj_size", "nonlinearity"):
    if hasattr(theirs, attr): assert getattr(ours, attr) == getattr(theirs, attr), attr
  # U(-1/sqrt(hidden), 1/sqrt(hidden)) for every parameter, and a torch state_dict loads unchanged
  bound = 1 / math.sqrt(3)
  vals = np.concatenate([p.numpy().ravel() for p in ours.parameters()])
  assert np.abs(vals).max() <= bound and np.abs(vals).max() > 0.8 * bound and abs(vals.mean()) < 0.25
  ours.load_state_dict({k: fg.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
  for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)


def same_error(call, exc=None, match: str | None = None) -> None:
  """call(L, tensor) raises in both libraries with the same type and message"""
  with pytest.raises(Exception) as theirs: call(torch.nn, torch.zeros)
  with pytest.raises(exc or theirs.type) as ours: call(fnn, fg.zeros)
  assert str(ours.value) == str(theirs.value)
  if match is not None: assert match in str(ours.value)


ERRORS = [
  # (constructor, call, a substring of the message) ; the message must be torch's
  (lambda L: L.LSTM(4, 3), lambda m, z: m(z(5, 2, 3)), "Expected 4, got 3"),
  (lambda L: L.GRU(4, 3, batch_first=True), lambda m, z: m(z(2, 5, 6)), "Expected 4, got 6"),
  (lambda L: L.RNN(4, 3), lambda m, z: m(z(2, 5, 3, 4)), "Expected input to be 2D or 3D, got 4D"),
  (lambda L: L.LSTM(4, 3), lambda m, z: m(z(4)), "got 1D"),
  (lambda L: L.GRU(4, 3), lambda m, z: m(z(5, 2, 4), z(2, 2, 3)), "Expected hidden size (1, 2, 3), got [2, 2, 3]"),
  (lambda L: L.RNN(4, 3, bidirectional=True), lambda m, z: m(z(5, 2, 4), z(2, 3, 3)), "(2, 2, 3), got [2, 3, 3]"),
  (lambda L: L.LSTM(4, 3), lambda m, z: m(z(5, 2, 4), (z(1, 3, 3), z(1, 2, 3))), "hidden[0] size (1, 2, 3)"),
  (lambda L: L.LSTM(4, 3, proj_size=2), lambda m, z: m(z(5, 2, 4), (z(1, 2, 3), z(1, 2, 3))), "got [1, 2, 3]"),
  (lambda L: L.LSTM(4, 3), lambda m, z: m(z(5, 2, 4), (z(1, 2, 3), z(1, 2, 2))), "hidden[1] size (1, 2, 3)"),
  (lambda L: L.LSTM(4, 3), lambda m, z: m(z(5, 2, 4), (z(2, 3), z(1, 2, 3))), "hx and cx should also be 3-D"),
  (lambda L: L.GRU(4, 3), lambda m, z: m(z(5, 4), z(1, 1, 3)), "hx should also be 2-D but got 3-D"),
  (lambda L: L.RNN(4, 3), lambda m, z: m(z(5, 2, 4), z(2, 3)), "hx should also be 3-D but got 2-D"),
  (lambda L: L.LSTM(4, 3), lambda m, z: m(z(0, 2, 4)), "sequence length"),
  (lambda L: L.LSTMCell(4, 3), lambda m, z: m(z(2, 5)), "inconsistent input_size: got 5 expected 4"),
  (lambda L: L.LSTMCell(4, 3), lambda m, z: m(z(2, 4), (z(2, 2), z(2, 3))), "hidden0 has inconsistent hidden_size"),
  (lambda L: L.GRUCell(4, 3), lambda m, z: m(z(2, 4), z(3, 3)), "Input batch size 2 doesn't match hidden0"),
  (lambda L: L.RNNCell(4, 3), lambda m, z: m(z(2, 2, 4)), "Expected input to be 1D or 2D, got 3D"),
  (lambda L: L.GRUCell(4, 3), lambda m, z: m(z(2, 4), z(1, 2, 3)), "Expected hidden to be 1D or 2D"),
  (lambda L: L.LSTMCell(4, 3), lambda m, z: m(z(2, 4), (z(2, 3), z(1, 2, 3))), "Expected hx[1] to be 1D or 2D"),
]


@pytest.mark.parametrize("build,call,match", ERRORS)
def test_input_errors_match_torch(build, call, match):
  same_error(lambda L, z: call(build(L), z), match=match)


@pytest.mark.parametrize("build,match", [
  (lambda L: L.RNN(4, 3, nonlinearity="gelu"), "Unknown nonlinearity 'gelu'"),
  (lambda L: L.GRU(4, 3, proj_size=2), "only supported for LSTM"),
  (lambda L: L.RNN(4, 3, proj_size=2), "only supported for LSTM"),
  (lambda L: L.LSTM(4, 3, proj_size=3), "proj_size has to be smaller than hidden_size"),
  (lambda L: L.LSTM(4, 3, dropout=1.5), "dropout should be a number in range [0, 1]"),
  (lambda L: L.GRU(0, 3), "input_size must be greater than zero"),
  (lambda L: L.GRU(4, 3, num_layers=0), "num_layers must be greater than zero"),
  (lambda L: L.RNN(4.0, 3), "input_size should be of type int"),
])
def test_constructor_errors_match_torch(build, match):
  same_error(lambda L, z: build(L), match=match)


def test_dtype_mismatch_and_packed_sequence():
  with pytest.raises(ValueError, match=r"RNN input dtype \(fusegrad.float64\) does not match weight dtype \(fusegrad.float32\)"):
    fnn.LSTM(4, 3)(fg.zeros(5, 2, 4, dtype=fg.float64))
  packed = torch.nn.utils.rnn.pack_padded_sequence(torch.zeros(5, 2, 4), [5, 3])
  for m in (fnn.LSTM(4, 3), fnn.GRU(4, 3), fnn.RNN(4, 3)):
    with pytest.raises(NotImplementedError, match="packed sequences \\(PackedSequence\\) are not supported"):
      m(packed)
  with pytest.raises(NotImplementedError, match="PackedSequence"):
    fnn.GRUCell(4, 3)(packed)


def test_dropout_warning_like_torch():
  with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
    fnn.GRU(4, 3, dropout=0.2)


# ---- schedule: one graph for the whole sequence --------------------------------------------------------------

def test_lstm_kernel_count(rng):
  """pinned: a 1-layer LSTM over T steps (zero initial state) is 2T + 1 kernels forward: the input projection of
  all steps (one matmul), per step h @ W_hhᵀ (none at the first step) and one kernel of gate math storing h and c,
  and the output's stack. The gradients of input and parameters of a loss of the output: 22 kernels at T = 3
  (the forward again, storing what the backward reads, then per step the gate gradients and dh @ W_hh; the
  gradients of W_ih, W_hh, each bias and the input are one kernel each, over all steps: 18, the biases' one value
  reduced twice since each bias is an argument of its own call, nn/rnn._input_projection, so a checked trace can
  replay the step; 22 before tensor.cat padded the stack's parts with -0.0, negations cost nothing in the
  schedule's rules, and the steps' summed gate gradients were stored at their sum's end, not every few steps)."""
  T = 3
  m = fnn.LSTM(I_, H_)
  randomize(m, rng, "CPU")
  xa = rng.standard_normal((T, N_, I_)).astype(np.float32)
  x = fg.tensor(xa, requires_grad=True).realize()
  with fg.track() as t:
    out = m(x)[0]   # (the final states dropped)
    assert t.kernels == [], "building the graph launched kernels"
    got = out.numpy()
  assert len(t.kernels) == 2 * T + 1
  with fg.track() as t:   # final states kept: computed with the output (realize.later), c_T and the stacks of both
    out, (h, c) = m(x)
    out.numpy()
    assert h.node.realized and c.node.realized
  assert len(t.kernels) == 2 * T + 3
  theirs = twin(m, lambda L: L.LSTM(I_, H_))
  close(fg.tensor(got), theirs(torch.tensor(xa, dtype=torch.float64))[0], "output")
  out = m(x)[0]
  out.sum().backward()
  with fg.track() as t:
    fg.realize(x.grad, *[p.grad for p in m.parameters()])
  assert len(t.kernels) == 18


def test_language_model_loop_keeps_no_lazy_state(rng):
  """pytorch/examples' word language model loop: the final states are carried to the next batch detached, the
  parameters updated by hand through `.data` after clip_grad_norm_, and only the loss read. Both the states
  (realize.later in the layer) and the parameters (a write through `.data`) are computed with the loss's realize,
  so nothing stays a lazy graph that grows with the steps (it did: each step recomputed the last one's forward and
  backward); losses and parameters follow torch's."""
  V, E, H, T, B = 50, 12, 16, 6, 3
  tm = torch.nn.ModuleDict({"enc": torch.nn.Embedding(V, E), "rnn": torch.nn.LSTM(E, H, 2), "dec": torch.nn.Linear(H, V)})
  fm = fnn.ModuleDict({"enc": fnn.Embedding(V, E), "rnn": fnn.LSTM(E, H, 2), "dec": fnn.Linear(H, V)})
  fm.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})

  def trainer(lib, m):
    state = {"h": (lib.zeros(2, B, H), lib.zeros(2, B, H))}
    def step(x, y):
      hidden = tuple(h.detach() for h in state["h"])
      m.zero_grad()
      out, hidden = m["rnn"](m["enc"](x), hidden)
      loss = lib.nn.functional.cross_entropy(m["dec"](out).view(-1, V), y)
      loss.backward()
      lib.nn.utils.clip_grad_norm_(m.parameters(), 0.25)
      for p in m.parameters(): p.data.add_(p.grad, alpha=-5.0)
      state["h"] = hidden
      return loss.item()
    return step, state

  fstep, fstate = trainer(fg, fm)
  tstep, _ = trainer(torch, tm)
  for _ in range(4):
    x, y = rng.integers(0, V, (T, B)), rng.integers(0, V, (T * B,))
    got, want = fstep(fg.tensor(x), fg.tensor(y)), tstep(torch.tensor(x), torch.tensor(y))
    assert abs(got - want) <= 1e-4 * abs(want), (got, want)
    assert all(p.node.realized for p in fm.parameters())
    assert all(h.node.realized for h in fstate["h"])
  for (k, p), tp in zip(fm.named_parameters(), tm.parameters()):
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
