"""Checked traces (engine/trace.py): an eager step's calls recorded once and replayed without building the graph.

Every test runs a training or inference loop twice, with traces off and on, from the same weights and random seed,
and asserts the trace's results are *bitwise* those of the plain eager path (the same kernels run on the same
values: a replay launches the plan the recording's realize made), that replays happened where the loop repeats
(trace.stats), and that whatever the trace cannot follow (another step, a value read in the middle, an in-place
op, a hook, a failing check) gives the eager answer too.
"""
from __future__ import annotations
import numpy as np
import pytest
import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.engine import trace
from nanogpt_model import GPTConfig, build
from trace_loops import run_both as _run_both, assert_same as _assert_same


def _train(opt, loss) -> np.float32:
  """One step of the usual loop: zero_grad, backward, step; the loss read afterwards."""
  opt.zero_grad()
  loss.backward()
  opt.step()
  return np.float32(loss.item())


def _close(a, b):
  for x, y in zip(a, b):
    for u, v in zip(x, y): np.testing.assert_allclose(u, v, rtol=2e-6, atol=1e-7)


def _mlp(opt_cls, **kw):
  def make():
    m = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
    return m, opt_cls(m.parameters(), **kw)
  return make


@pytest.mark.parametrize("opt_cls,kw", [(fg.optim.SGD, dict(lr=0.05, momentum=0.9)), (fg.optim.Adam, dict(lr=1e-2)),
                                        (fg.optim.AdamW, dict(lr=1e-2, weight_decay=0.1))])
def test_training_loop_replays_bitwise(traced, rng, opt_cls, kw):
  xs = [rng.standard_normal((8, 12), dtype=np.float32) for _ in range(3)]
  ys = [rng.integers(0, 5, 8) for _ in range(3)]
  def body(m, opt, i):
    loss = F.cross_entropy(m(fg.tensor(xs[i % 3])), fg.tensor(ys[i % 3]))
    return [_train(opt, loss)]
  off, on, d = _run_both(traced, _mlp(opt_cls, **kw), 8, body)
  _assert_same(off, on)
  assert d["replays"] >= 4, d
  assert d["deviations"] <= 2, d      # the first steps change structure (state appears), then they repeat


def test_gpt_step_replays_bitwise(traced, rng):
  cfg = GPTConfig(block_size=16, vocab_size=29, n_layer=1, n_head=2, n_embd=16, dropout=0.0, bias=True)
  batches = [(rng.integers(0, 29, (2, 16)), rng.integers(0, 29, (2, 16))) for _ in range(2)]
  def make():
    m = build(fg)(cfg)
    return m, m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
  def body(m, opt, i):
    x, y = batches[i % 2]
    _, loss = m(fg.tensor(x), fg.tensor(y))
    return [_train(opt, loss)]
  off, on, d = _run_both(traced, make, 7, body)
  _assert_same(off, on)
  assert d["replays"] >= 3, d


def test_random_draws_in_a_replayed_step(traced, rng):
  """A step that draws random numbers (dropout, randn_like): each replay draws new ones, as eager does."""
  x = rng.standard_normal((6, 10), dtype=np.float32)
  def make():
    m = nn.Sequential(nn.Linear(10, 10), nn.Dropout(0.3), nn.Linear(10, 4))
    return m, fg.optim.SGD(m.parameters(), lr=0.1)
  def body(m, opt, i):
    h = m(fg.tensor(x))
    loss = (h + 0.1 * fg.randn_like(h)).square().mean()
    return [_train(opt, loss)]
  off, on, d = _run_both(traced, make, 7, body)
  _assert_same(off, on)
  assert d["replays"] >= 3, d
  losses = [r[0] for r in on[:-1]]
  assert len(set(losses)) == len(losses)   # new masks and noise every step


def test_deviation_gives_eager_results(traced, rng):
  """Steps that differ from the recorded one at various points (a batch of another size, an extra op, a value read
  in the middle, an in-place op) deviate and give the eager answer."""
  xs = [rng.standard_normal((8, 12), dtype=np.float32) for _ in range(2)] + [rng.standard_normal((5, 12), dtype=np.float32)]
  def body(m, opt, i):
    h = m(fg.tensor(xs[i % 3] if i != 5 else xs[0]))
    if i == 4: h = h * 2                      # an extra call
    if i == 6: h.add_(1.0)                    # an in-place op on a result
    if i == 7: _ = float(h.sum().item())      # a value read mid-step
    loss = h.square().mean()
    return [_train(opt, loss), m[0].weight.grad.numpy().copy()]
  off, on, d = _run_both(traced, _mlp(fg.optim.SGD, lr=0.05, momentum=0.5), 10, body)
  # the losses and the parameters bitwise; a gradient read after a replayed step is its value where the trace's
  # buffers still hold it, else made again from its recipe alone (`trace.materialize`): float reassociation, as for
  # the activations of test_results_kept_after_a_replayed_step (on a Zen 4 its kernels sum in another order)
  _assert_same([r[:1] for r in off[:-1]] + off[-1:], [r[:1] for r in on[:-1]] + on[-1:])
  for x, y in zip(off[:-1], on[:-1]): np.testing.assert_allclose(x[1], y[1], rtol=1e-5, atol=1e-7)
  assert d["deviations"] >= 2 and d["replays"] >= 1, d


def test_results_kept_after_a_replayed_step(traced, rng):
  """Activations and gradients kept after the step (its optimizer wrote the weights since) hold the step's values."""
  x = rng.standard_normal((8, 12), dtype=np.float32)
  def body(m, opt, i):
    h = m(fg.tensor(x))
    loss = h.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return [h.numpy().copy(), m[2].bias.grad.numpy().copy(), (h.argmax(-1) == 1).float().mean().numpy()]
  off, on, d = _run_both(traced, _mlp(fg.optim.SGD, lr=0.1), 10, body)
  # a kept activation is the value the step computed where its plan kept it (`_exact`), else computed again after
  # the step (its graph alone, not fused with the step's other kernels: float reassociation)
  for x, y in zip(off, on):
    for u, v in zip(x, y): np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
  assert d["replays"] >= 4, (d, list(trace.why))


def test_check_on_a_replayed_input_still_raises(traced, rng):
  """A class index out of range raises in a replayed step as it does eagerly (the recorded check runs again)."""
  traced(True)
  m, opt = _mlp(fg.optim.SGD, lr=0.1)()
  x = fg.tensor(rng.standard_normal((8, 12), dtype=np.float32))
  def step(y):
    loss = F.cross_entropy(m(x), fg.tensor(y))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()
  for _ in range(4): step(rng.integers(0, 5, 8))
  before = dict(trace.stats)
  bad = rng.integers(0, 5, 8)
  bad[3] = 7
  with pytest.raises(IndexError, match="out of bounds"): step(bad)
  assert trace.stats["deviations"] - before["deviations"] == 1
  np.testing.assert_array_equal(np.isfinite(step(rng.integers(0, 5, 8))), True)


def test_inference_loop_replays(traced, rng):
  xs = [rng.standard_normal((4, 12), dtype=np.float32) for _ in range(3)]
  def body(m, opt, i):
    with fg.no_grad():
      out = m(fg.tensor(xs[i % 3])).softmax(-1)
      return [out.numpy().copy(), np.int64(out.argmax(-1).sum().item())]
  off, on, d = _run_both(traced, _mlp(fg.optim.SGD, lr=0.1), 6, body)
  _assert_same(off, on)
  assert d["replays"] >= 2, d


def test_gradient_accumulation_replays_bitwise(traced, rng):
  """Micro-batches whose backward passes accumulate into .grad before one step (nanoGPT's loop, with its clipping):
  replayed, bitwise the eager values; a gradient kept after the step holds the accumulated value."""
  xs = [rng.standard_normal((8, 12), dtype=np.float32) for _ in range(2)]
  def body(m, opt, i):
    x = xs[i % 2]
    for half in (x[:4], x[4:]):
      loss = m(fg.tensor(half)).square().mean() / 2
      loss.backward()
    fg.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return [np.float32(loss.item())]
  off, on, d = _run_both(traced, _mlp(fg.optim.AdamW, lr=1e-2), 8, body)
  _assert_same(off, on)
  assert d["replays"] >= 4, (d, list(trace.why))


def test_gradient_accumulated_across_steps(traced, rng):
  """Accumulating into gradients left from an earlier segment (no zero_grad between steps) and reading one after
  the step: the eager values (each step's gradient is a longer graph: the steps are not all replayed)."""
  x = rng.standard_normal((8, 12), dtype=np.float32)
  def body(m, opt, i):
    m(fg.tensor(x)).square().mean().backward()
    opt.step()
    return [m[2].bias.grad.numpy().copy()]
  off, on, d = _run_both(traced, _mlp(fg.optim.SGD, lr=0.01), 8, body)
  _close(off, on)


def test_two_models_alternating(traced, rng):
  """Two models of the same structure trained alternately: a replay binds whichever model's weights the step reads."""
  x = rng.standard_normal((8, 12), dtype=np.float32)
  def make():
    a, b = _mlp(fg.optim.SGD, lr=0.1)(), _mlp(fg.optim.SGD, lr=0.2)()
    seq = nn.ModuleList([a[0], b[0]])
    return seq, (a, b)
  def body(ms, pairs, i):
    m, opt = pairs[i % 2]
    loss = m(fg.tensor(x)).square().mean()
    return [_train(opt, loss)]
  off, on, d = _run_both(traced, make, 8, body)
  _assert_same(off, on)
  assert d["replays"] >= 3, d


def test_gan_steps_share_their_first_call(traced, rng):
  """DCGAN's loop: a discriminator step and a generator step alternate, both starting with the generator's forward
  (one trace family, two branches that differ after it): both replayed, bitwise the eager values."""
  zs = [rng.standard_normal((8, 4), dtype=np.float32) for _ in range(2)]
  real = rng.standard_normal((8, 6), dtype=np.float32)
  def make():
    g, d = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6)), nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    return nn.ModuleList([g, d]), (fg.optim.Adam(g.parameters(), lr=1e-2), fg.optim.Adam(d.parameters(), lr=1e-2))
  def body(ms, opts, i):
    g, d = ms
    fake = g(fg.tensor(zs[i % 2]))
    ones, zeros = fg.ones(8, 1), fg.zeros(8, 1)
    if i % 2 == 0:   # the discriminator's step
      loss = F.binary_cross_entropy_with_logits(d(fg.tensor(real)), ones) + \
        F.binary_cross_entropy_with_logits(d(fake.detach()), zeros)
      opts[1].zero_grad()
      loss.backward()
      opts[1].step()
    else:            # the generator's
      loss = F.binary_cross_entropy_with_logits(d(fake), ones)
      opts[0].zero_grad()
      loss.backward()
      opts[0].step()
    return [np.float32(loss.item())]
  off, on, d = _run_both(traced, make, 14, body)
  _assert_same(off, on)
  assert d["replays"] >= 8 and d["records"] <= 6, (d, list(trace.why))



def test_gan_step_with_both_backwards_in_one_step(traced, rng):
  """The generated batch is detached for the discriminator's backward and differentiated for the generator's in the
  same step: the first backward did not reach its graph, so the replayed step's second backward goes through it
  (it raised "backward through the graph a second time" from the first replay on)."""
  zs = [rng.standard_normal((8, 5), dtype=np.float32) for _ in range(3)]
  def make():
    g, d = nn.Linear(5, 10), nn.Linear(10, 1)
    return nn.ModuleList([g, d]), (fg.optim.SGD(g.parameters(), lr=0.05), fg.optim.SGD(d.parameters(), lr=0.05))
  def body(ms, opts, i):
    g, d = ms
    fake = g(fg.tensor(zs[i % 3]))
    l1 = d(fake.detach()).mean()
    opts[1].zero_grad(); l1.backward(); opts[1].step()
    l2 = d(fake).mean()
    opts[0].zero_grad(); l2.backward(); opts[0].step()
    return [np.float32(l1.item()), np.float32(l2.item())]
  off, on, d = _run_both(traced, make, 8, body)
  _assert_same(off, on)
  assert d["replays"] >= 4, (d, list(trace.why))

def test_a_step_that_reads_a_value_every_third_time(traced, rng):
  """A step that logs its gradient norm in the middle every third step (a realize the others do not have): the two
  variants become two branches of one family, both replayed."""
  xs = [rng.standard_normal((8, 12), dtype=np.float32) for _ in range(3)]
  ys = [rng.integers(0, 5, 8) for _ in range(3)]
  def body(m, opt, i):
    loss = F.cross_entropy(m(fg.tensor(xs[i % 3])), fg.tensor(ys[i % 3]))
    opt.zero_grad()
    loss.backward()
    norm = fg.nn.utils.clip_grad_norm_(m.parameters(), 10.0)
    seen = float(norm.item()) if i % 3 == 0 else 0.0
    opt.step()
    return [np.float32(loss.item()), np.float32(seen)]
  off, on, d = _run_both(traced, _mlp(fg.optim.SGD, lr=0.05, momentum=0.9), 15, body)
  _assert_same(off, on)
  assert d["replays"] >= 10, (d, list(trace.why))


class _Block(nn.Module):
  """torchvision's BasicBlock pattern: batch norms (running statistics written in the forward), an in-place ReLU and
  an in-place residual add on the step's results."""
  def __init__(self, momentum=0.1):
    super().__init__()
    self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4, momentum=momentum)
    self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4, momentum=momentum)
    self.relu = nn.ReLU(inplace=True)
    self.fc = nn.Linear(4, 3)

  def forward(self, x):
    out = self.relu(self.bn1(self.conv1(x)))
    identity = out
    out = self.bn2(self.conv2(out))
    out += identity
    return self.fc(self.relu(out).mean((2, 3)))


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_block_replays_bitwise(traced, rng, momentum):
  xs = [rng.standard_normal((2, 3, 6, 6), dtype=np.float32) for _ in range(2)]
  ys = [rng.integers(0, 3, 2) for _ in range(2)]
  def make():
    m = _Block(momentum)
    return m, fg.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
  def body(m, opt, i):
    loss = F.cross_entropy(m(fg.tensor(xs[i % 2])), fg.tensor(ys[i % 2]))
    first = _train(opt, loss)
    if i == 6: _ = m.bn1.running_mean.numpy()     # a written statistic read mid-loop (after the step: realized)
    return [first] + [v.numpy().copy() for v in m.state_dict().values()]
  off, on, d = _run_both(traced, make, 8, body)
  _assert_same(off, on)
  if momentum is not None: assert d["replays"] >= 3, d


def test_statistic_read_inside_a_replayed_step(traced, rng):
  """A running statistic read between the forward and the backward of a replayed step: the replay deviates and the
  value read is the one eager computes."""
  x = rng.standard_normal((2, 3, 6, 6), dtype=np.float32)
  def make():
    m = _Block()
    return m, fg.optim.SGD(m.parameters(), lr=0.05)
  def body(m, opt, i):
    loss = m(fg.tensor(x)).square().mean()
    seen = m.bn2.running_var.numpy().copy() if i == 5 else np.zeros(4, np.float32)
    return [_train(opt, loss), seen]
  off, on, d = _run_both(traced, make, 7, body)
  _assert_same(off, on)
  assert d["deviations"] >= 1 and d["replays"] >= 2, d


def test_gradient_clipping_replays_bitwise(traced, rng):
  """nanoGPT's loop clips the gradients' norm in place before the step (clip_grad_norm_: norms stacked, each
  gradient scaled in place): followed, bitwise the eager values."""
  xs = [rng.standard_normal((8, 12), dtype=np.float32) for _ in range(2)]
  ys = [rng.integers(0, 5, 8) for _ in range(2)]
  def body(m, opt, i):
    loss = F.cross_entropy(m(fg.tensor(xs[i % 2])), fg.tensor(ys[i % 2]))
    opt.zero_grad()
    loss.backward()
    norm = fg.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    opt.step()
    return [np.float32(loss.item()), norm.numpy(), m[0].weight.grad.numpy().copy()]
  off, on, d = _run_both(traced, _mlp(fg.optim.AdamW, lr=1e-2), 8, body)
  # losses and parameters bitwise; the norm and a gradient read after the step are the values the step computed
  # where its plan kept them (`_exact`), else computed again then (their graph alone: float reassociation)
  _assert_same([r[:1] for r in off[:-1]] + off[-1:], [r[:1] for r in on[:-1]] + on[-1:])
  _close([r[1:] for r in off[:-1]], [r[1:] for r in on[:-1]])
  assert d["replays"] >= 4, (d, list(trace.why))


def test_shared_gradient_value_written_in_place_replays(traced, rng):
  """Two parameters whose gradients are one value (a bias pair, as an LSTM's b_ih and b_hh: x W^T + (b1 + b2))
  each get their own .grad, so clip_grad_norm_'s in-place scaling scales each once, with traces on or off, as in
  PyTorch (they shared one tensor, scaled twice)."""
  torch = pytest.importorskip("torch")
  xs = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(3)]
  w0, b0 = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(3).astype(np.float32)

  class Net(fg.nn.Module):
    def __init__(self):
      super().__init__()
      self.fc = fg.nn.Linear(5, 3, bias=False)
      self.b1 = fg.nn.Parameter(fg.tensor(b0))
      self.b2 = fg.nn.Parameter(fg.tensor(b0))
    def forward(self, x): return self.fc(x) + (self.b1 + self.b2)

  def make():
    m = Net()
    m.fc.weight.data.copy_(fg.tensor(w0))
    return m, fg.optim.SGD(m.parameters(), lr=0.5)

  def body(m, opt, i):
    opt.zero_grad()
    loss = (m(fg.tensor(xs[i % 3])) ** 2).sum()
    loss.backward()
    fg.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    opt.step()
    return [loss.detach().numpy().copy()]

  off, on, _stats = _run_both(traced, make, 6, body)
  _assert_same(off, on)   # (the step is not replayed: `b1 + b2` is no call a trace keys)
  tw, tb, tb2 = (torch.tensor(a, requires_grad=True) for a in (w0, b0, b0))
  topt = torch.optim.SGD([tw, tb, tb2], lr=0.5)
  for i in range(6):
    topt.zero_grad()
    loss = ((torch.tensor(xs[i % 3]) @ tw.T + (tb + tb2)) ** 2).sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([tw, tb, tb2], 0.5)
    topt.step()
    np.testing.assert_allclose(off[i][0], loss.item(), rtol=1e-5)
  got = dict(zip([n for n, _ in make()[0].named_parameters()], on[-1]))
  np.testing.assert_allclose(got["b1"], tb.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["b2"], tb2.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["fc.weight"], tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_recurrent_language_model_loop_replays_bitwise(traced, rng):
  """pytorch/examples' word language model loop: a 2-layer LSTM whose hidden state is carried to the next batch
  detached, clip_grad_norm_, and the parameters updated by hand through `.data` with grad mode on. Every weight
  and bias is an argument of a call of its own (nn/rnn._input_projection, F.linear for h @ W_hh^T), and the
  `.data` writes are followed (neither side requires grad): the steps replay. Their values are the eager ones within
  float32 reassociation, not bitwise: a recurrent weight's gradient sums its steps' terms, and the traced calls'
  graph adds them in another order than the untraced frontend's (1-2 ulp, measured over 12 seeds; FUSEGRAD_TEMPLATES=0
  gives the same graphs). A parameter read between its write and the realize, and a view of one kept across steps,
  give the eager values."""
  V, E, H, T, B = 50, 12, 16, 5, 3
  data = [(rng.integers(0, V, (T, B)), rng.integers(0, V, T * B)) for _ in range(2)]

  class Net(nn.Module):
    def __init__(self):
      super().__init__()
      self.encoder, self.rnn, self.decoder = nn.Embedding(V, E), nn.LSTM(E, H, 2), nn.Linear(H, V)
    def forward(self, x, hidden):
      out, hidden = self.rnn(self.encoder(x), hidden)
      return F.log_softmax(self.decoder(out).view(-1, V), dim=1), hidden

  def make():
    m = Net()
    m.hidden = (fg.zeros(2, B, H), fg.zeros(2, B, H))
    return m, None

  def body(m, _opt, i):
    x, y = data[i % 2]
    hidden = tuple(h.detach() for h in m.hidden)
    m.zero_grad()
    out, m.hidden = m(fg.tensor(x), hidden)
    loss = F.nll_loss(out, fg.tensor(y))
    loss.backward()
    fg.nn.utils.clip_grad_norm_(m.parameters(), 0.25)
    for p in m.parameters(): p.data.add_(p.grad, alpha=-2.0)
    return [np.float32(loss.item())]

  off, on, d = _run_both(traced, make, 8, body)
  _close(off, on)
  assert d["replays"] >= 4, (d, list(trace.why))

  def body_read(m, _opt, i):   # a parameter read between its write through `.data` and the step's realize
    loss = body(m, _opt, i)
    return loss + [m.decoder.weight.sum().numpy(), m.rnn.weight_hh_l0.numpy().copy(),
                   m.decoder.bias.data.numpy().copy(), (m.decoder.bias.data * 2).numpy()]

  def make_viewed():   # a view of a parameter kept across the steps: its writes are made eagerly
    m, o = make()
    m.kept = m.decoder.weight.T
    return m, o

  def body_view(m, _opt, i): return body(m, _opt, i) + [m.kept.numpy().copy()]
  for mk, b in ((make, body_read), (make_viewed, body_view)):
    off, on, _d = _run_both(traced, mk, 5, b)
    _close(off, on)


def test_a_state_dict_taken_mid_training_follows_the_batch_norm_statistics(traced, rng):
  """state_dict() entries share storage with the module (torch's): one taken between training steps sees the running
  statistics the next steps write. A replayed step held those writes until its realize, and the entry, a live view,
  kept the statistics of the step before (a checkpoint with new weights and stale batch norm buffers)."""
  traced(True)
  xs = [rng.standard_normal((8, 3), dtype=np.float32) * 2 + 1 for _ in range(6)]
  bn = nn.BatchNorm1d(3)
  sds = []
  for i, x in enumerate(xs):
    bn(fg.tensor(x))
    if i in (1, 3): sds.append(bn.state_dict())
  for sd in sds:
    for k in ("running_mean", "running_var", "num_batches_tracked"):
      np.testing.assert_array_equal(sd[k].numpy(), getattr(bn, k).numpy())
