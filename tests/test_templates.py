"""A backward of a structure seen before is made from a template (autograd.py, "backward templates").

The template path must give the graph the rules would build: these tests compare it bitwise with the rules' run
(`config.TEMPLATES = False`) over several training steps, check gradients against torch where constants change
from step to step (a rule may fold a constant into a new one: its value is in the key), and check that PyTorch's
errors (a second backward through a freed graph, a saved value modified in place) are raised on the template path
too. Every test counts the backward passes the templates made, so none passes by running the rules only.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad import autograd as A, config
from fusegrad.engine import trace


@pytest.fixture(autouse=True)
def _no_trace(monkeypatch):
  """These tests count the templates' hits: a replayed step (engine/trace.py) makes none (tests/test_trace.py)."""
  monkeypatch.setattr(trace, "ENABLED", False)


@pytest.fixture(autouse=True)
def _templates_on():
  old = config.TEMPLATES
  config.TEMPLATES = True
  A._templates.clear()
  yield
  config.TEMPLATES = old


def _hits() -> int: return A._templates_hits[0]


def _mlp_steps(rng, templates: bool, steps: int, device: str, adam: bool = True):
  config.TEMPLATES = templates
  fg.manual_seed(0)
  model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 5)).to(device)
  opt = fg.optim.AdamW(model.parameters(), lr=1e-2) if adam else fg.optim.SGD(model.parameters(), 0.1, momentum=0.9)
  data = [(rng.standard_normal((8, 12), dtype=np.float32), rng.integers(0, 5, 8)) for _ in range(steps)]
  losses = []
  for x, y in data:
    loss = F.cross_entropy(model(fg.tensor(x, device=device)), fg.tensor(y, device=device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
  return losses, [p.numpy() for p in model.parameters()]


def test_training_steps_equal_the_rules_run(device, monkeypatch):
  # backward templates alone: bitwise the rules' run
  from fusegrad import templates
  monkeypatch.setattr(templates, "FORWARD", False)
  seed = np.random.SeedSequence().entropy
  want = _mlp_steps(np.random.default_rng(seed), False, 5, device)
  before = _hits()
  got = _mlp_steps(np.random.default_rng(seed), True, 5, device)
  assert _hits() - before >= 3          # the first step (lazy initial weights) and the second record
  assert got[0] == want[0]
  for a, b in zip(got[1], want[1]): np.testing.assert_array_equal(a, b)


def test_training_steps_with_forward_templates(device):
  # forward templates too: a templated call's gradient sums its inner contributions first (float reassociation,
  # which Adam would amplify where a gradient is a cancellation's rounding: SGD here)
  seed = np.random.SeedSequence().entropy
  want = _mlp_steps(np.random.default_rng(seed), False, 7, device, adam=False)
  before, fwd = _hits(), FT.stats["hits"]
  got = _mlp_steps(np.random.default_rng(seed), True, 7, device, adam=False)
  assert _hits() - before >= 3 and FT.stats["hits"] - fwd >= 8   # layer_norm and gelu of 4+ steps
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for a, b in zip(got[1], want[1]): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_gpt_backward_from_template_is_bitwise_the_rules(monkeypatch):
  from fusegrad import templates
  monkeypatch.setattr(templates, "FORWARD", False)
  import sys, os
  sys.path.insert(0, os.path.dirname(__file__))
  from nanogpt_model import GPTConfig, build
  cfg = GPTConfig(block_size=16, vocab_size=33, n_layer=1, n_head=2, n_embd=16, dropout=0.0, bias=True)
  rng = np.random.default_rng()
  batches = [(rng.integers(0, 33, (4, 16)), rng.integers(0, 33, (4, 16))) for _ in range(4)]
  def run(templates):
    config.TEMPLATES = templates
    fg.manual_seed(0)
    m = build(fg)(cfg)
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    for x, y in batches:
      _, loss = m(fg.tensor(x), fg.tensor(y))
      opt.zero_grad()
      loss.backward()
      opt.step()
    return [p.numpy() for p in m.parameters()]
  want = run(False)
  before = _hits()
  got = run(True)
  assert _hits() - before >= 2
  for a, b in zip(got, want): np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", ["mul", "pow", "div", "scale_then_pow"])
def test_changing_constants_reach_the_gradient(op, device):
  # x * c, x ** c, c / x: a new Python number each step is a kernel argument (same structure) but the rules may
  # fold it (pow's c - 1): a template serves the values it was made with only, so the gradient follows the value
  rng = np.random.default_rng()
  x0 = rng.uniform(0.5, 2.0, (6, 7)).astype(np.float32)
  fns = {"mul": lambda x, c: x * c, "pow": lambda x, c: x ** c, "div": lambda x, c: c / x,
         "scale_then_pow": lambda x, c: (x * (c + 1)) ** (c / 2)}
  f = fns[op]
  before = _hits()
  for c in (1.7, 2.3, 1.7, 2.3, 0.6):
    x = fg.tensor(x0, device=device, requires_grad=True)
    f(x, c).sum().backward()
    xt = torch.tensor(x0, requires_grad=True)
    f(xt, c).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
  assert _hits() - before >= 2



def test_batches_sliced_from_a_dataset_tensor_get_their_own_gradients(device):
  # each step's batch is a view of one realized tensor at another offset (the structure keys such a view without
  # its offset): a rule's view of it (a matmul's x.T) has the offset in it, so a template made for one batch must not
  # serve the next (it gave every step the first batch's weight gradient)
  rng = np.random.default_rng()
  data, w0 = rng.standard_normal((40, 10), dtype=np.float32), rng.standard_normal((4, 10), dtype=np.float32)
  d = fg.tensor(data, device=device)
  for i in (0, 1, 2, 1, 3):
    w = fg.tensor(w0, device=device, requires_grad=True)
    (d[i * 8:(i + 1) * 8] @ w.T).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.broadcast_to(data[i * 8:(i + 1) * 8].sum(0), (4, 10)),
                               rtol=1e-5, atol=1e-5)
  # a training loop over such batches follows PyTorch's step for step
  y = rng.integers(0, 3, 40)
  lins = []
  for L in (torch, fg):
    lin = L.nn.Linear(10, 3)
    with L.no_grad():
      lin.weight.copy_(L.tensor(w0[:3])); lin.bias.zero_()
    opt = L.optim.SGD(lin.parameters(), lr=0.1)
    x, t = L.tensor(data), L.tensor(y)
    for i in range(5):
      loss = L.nn.functional.cross_entropy(lin(x[i * 8:(i + 1) * 8]), t[i * 8:(i + 1) * 8])
      opt.zero_grad(); loss.backward(); opt.step()
    lins.append(lin.weight.detach().numpy())
  np.testing.assert_allclose(lins[1], lins[0], rtol=1e-5, atol=1e-6)

def test_second_backward_through_a_freed_graph_raises_on_the_template_path():
  rng = np.random.default_rng()
  w = fg.tensor(rng.standard_normal((5, 5), dtype=np.float32), requires_grad=True)
  before = _hits()
  for i in range(4):
    x = fg.tensor(rng.standard_normal((4, 5), dtype=np.float32))
    y = (x @ w).exp().sum()
    y.backward()
  assert _hits() - before >= 2
  with pytest.raises(RuntimeError, match="backward through the graph a second time"):
    y.backward()


def test_retain_graph_on_the_template_path():
  rng = np.random.default_rng()
  a = rng.standard_normal((4, 5), dtype=np.float32)
  for i in range(3):
    w = fg.tensor(a, requires_grad=True)
    y = (w.tanh() * w).sum()
    y.backward(retain_graph=True)
    y.backward()
    wt = torch.tensor(a, requires_grad=True)
    (wt.tanh() * wt).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * wt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_inplace_modification_of_a_saved_value_raises_on_the_template_path():
  rng = np.random.default_rng()
  a = rng.standard_normal((4, 5), dtype=np.float32)
  before = _hits()
  for i in range(4):    # the same structure recorded, then hit; the last time exp's saved output is written first
    w = fg.tensor(a, requires_grad=True)
    y = w.exp()
    z = y.sum()
    if i < 3:
      z.backward()
      np.testing.assert_allclose(w.grad.numpy(), np.exp(a), rtol=1e-6)
      continue
    y.add_(1)     # exp's rule reads its output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
      z.backward()
  assert _hits() - before == 3   # the failing backward's key is a hit too: the check runs on the template path


def test_gradients_accumulate_and_are_fresh_tensors():
  rng = np.random.default_rng()
  a = rng.standard_normal((3, 4), dtype=np.float32)
  w = fg.tensor(a, requires_grad=True)
  before = _hits()
  for i in range(3): (w * w).sum().backward()
  assert _hits() - before == 2
  np.testing.assert_allclose(w.grad.numpy(), 6 * a, rtol=1e-6)
  g = w.grad
  g.mul_(0)             # a gradient is its own tensor: writing it changes nothing else
  np.testing.assert_array_equal(w.numpy(), a)


def test_a_different_structure_records_its_own_template():
  rng = np.random.default_rng()
  a = rng.standard_normal((3, 4), dtype=np.float32)
  outs = []
  for shape_op in ("sum", "mean", "sum", "mean"):
    w = fg.tensor(a, requires_grad=True)
    getattr(w.sin(), shape_op)().backward()
    outs.append(w.grad.numpy())
  np.testing.assert_allclose(outs[0], np.cos(a), rtol=1e-6)
  np.testing.assert_allclose(outs[1], np.cos(a) / a.size, rtol=1e-6)
  np.testing.assert_array_equal(outs[2], outs[0])
  np.testing.assert_array_equal(outs[3], outs[1])


# ---- forward templates of library functions (fusegrad/templates.py) --------------------------------------------

from fusegrad import templates as FT   # noqa: E402


def _fwd_cases():
  Ft = torch.nn.functional
  return {
    "layer_norm": (lambda lib, x, w, b: lib.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5), 3),
    "softmax": (lambda lib, x, w, b: x.softmax(-1) * w, 3),
    "log_softmax": (lambda lib, x, w, b: lib.nn.functional.log_softmax(x * w, dim=-1) + b, 3),
    "gelu": (lambda lib, x, w, b: lib.nn.functional.gelu(x * w + b), 3),
    "gelu_tanh": (lambda lib, x, w, b: lib.nn.functional.gelu(x, approximate="tanh") * w, 3),
    "rms_norm": (lambda lib, x, w, b: lib.nn.functional.rms_norm(x, (x.shape[-1],), w), 3),
    "sdpa_causal": (lambda lib, x, w, b: lib.nn.functional.scaled_dot_product_attention(
        x.reshape(2, 3, 4, 8), (x * w).reshape(2, 3, 4, 8), (x + b).reshape(2, 3, 4, 8), is_causal=True), 3),
    "linear": (lambda lib, x, w, b: lib.nn.functional.linear(x, w.reshape(1, 8).expand(3, 8) * 1, b[:3]), 3),
    "silu": (lambda lib, x, w, b: lib.nn.functional.silu(x * w) + b, 3),
    "bce": (lambda lib, x, w, b: lib.nn.functional.binary_cross_entropy(
        (x * w * 0.2).sigmoid(), b.sigmoid().expand(6, 4, 8), reduction="none"), 3),
    "bce_logits": (lambda lib, x, w, b: lib.nn.functional.binary_cross_entropy_with_logits(
        x, (b * w).sigmoid().expand(6, 4, 8), reduction="none"), 3),
    "mse": (lambda lib, x, w, b: lib.nn.functional.mse_loss(x * w, b.expand(6, 4, 8), reduction="none"), 3),
    "sdpa_self": (lambda lib, x, w, b: lib.nn.functional.scaled_dot_product_attention(
        x.reshape(2, 3, 4, 8), x.reshape(2, 3, 4, 8), x.reshape(2, 3, 4, 8)), 3),
    "conv1d": (lambda lib, x, w, b: lib.nn.functional.conv1d(x, w.reshape(2, 4, 1), b[:2], padding=1), 3),
    "conv2d_strided": (lambda lib, x, w, b: lib.nn.functional.conv2d(
        x.reshape(6, 1, 4, 8), w.reshape(2, 1, 2, 2), b[:2], stride=2, padding=1), 3),
    "group_norm": (lambda lib, x, w, b: lib.nn.functional.group_norm(x, 2, w[:4], b[:4]), 3),
    "batch_norm_train": (lambda lib, x, w, b: lib.nn.functional.batch_norm(x, None, None, w[:4], b[:4], True), 3),
    "batch_norm_eval": (lambda lib, x, w, b: lib.nn.functional.batch_norm(
        x, (b[:4] * 0.5).detach(), (w[:4] * w[:4] + 0.5).detach(), w[:4], b[:4], False), 3),
  }


@pytest.mark.parametrize("case", list(_fwd_cases()))
def test_templated_functions_match_torch_and_the_frontend(case, device):
  f, _ = _fwd_cases()[case]
  rng = np.random.default_rng()
  results = []
  for templates in (False, True, True, True):
    config.TEMPLATES = templates
    x0 = (rng.standard_normal((6, 4, 8)) * 3 + 1).astype(np.float32)
    w0, b0 = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    x, w, b = (fg.tensor(a, device=device, requires_grad=True) for a in (x0, w0, b0))
    hits = FT.stats["hits"]
    with fg.track() as tr:
      y = f(fg, x, w, b)
      (y * y).sum().backward()
      fg.realize(*[t for t in (y, x.grad, w.grad, b.grad) if t is not None])
    if templates and len(results) >= 2: assert FT.stats["hits"] > hits, "the call did not come from a template"
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x0, w0, b0))
    yt = f(torch, xt, wt, bt)
    (yt * yt).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=2e-5, atol=2e-5)
    # the gradients against float64 torch, within float32 torch's own distance from it: a gradient summing large
    # terms that cancel (a saturated causal softmax's w and b gradients) carries an absolute error of the terms' scale
    x64, w64, b64 = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x0, w0, b0))
    y64 = f(torch, x64, w64, b64)
    (y64 * y64).sum().backward()
    for a, at, a64 in ((x, xt, x64), (w, wt, w64), (b, bt, b64)):
      if at.grad is None: assert a.grad is None
      else:
        want = a64.grad.numpy()
        torch_err = np.abs(at.grad.numpy() - want).max()
        np.testing.assert_allclose(a.grad.numpy(), want, rtol=1e-4,
                                   atol=1e-4 * max(1.0, np.abs(want).max()) + 8 * torch_err)
    results.append(len(tr.kernels))
  # nothing computed twice (the gradient rule's rebuild finds the template's nodes); a templated call's gradient is
  # summed inside its rule first, which may fuse into fewer kernels (causal attention: 12 instead of 13)
  assert results[-1] <= results[0], "a templated call and its backward launch more kernels than the frontend's"


def test_a_changed_argument_is_a_new_template(device):
  rng = np.random.default_rng()
  x0 = rng.standard_normal((5, 16)).astype(np.float32) * 10
  for eps in (1e-5, 1.0, 1e-5, 1.0):   # eps is baked into the graph: each value its own template
    y = fg.nn.functional.layer_norm(fg.tensor(x0, device=device), (16,), eps=eps).numpy()
    want = torch.nn.functional.layer_norm(torch.tensor(x0), (16,), eps=eps).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_random_draws_are_never_templated():
  # a dropout inside the attention draws random numbers (host code): every call must draw afresh
  rng = np.random.default_rng()
  q = fg.tensor(rng.standard_normal((2, 2, 8, 4)).astype(np.float32))
  outs = [fg.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5).numpy() for _ in range(4)]
  for a, b in zip(outs, outs[1:]): assert not np.array_equal(a, b)


def test_double_backward_through_a_templated_call():
  rng = np.random.default_rng()
  x0, w0 = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
  for i in range(3):
    x, w = fg.tensor(x0, requires_grad=True), fg.tensor(w0, requires_grad=True)
    y = fg.nn.functional.layer_norm(x, (6,), w)
    (g,) = fg.autograd.grad((y * y).sum(), [x], create_graph=True)
    g.sum().backward()
    xt, wt = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    (gt,) = torch.autograd.grad((torch.nn.functional.layer_norm(xt, (6,), wt) ** 2).sum(), [xt], create_graph=True)
    gt.sum().backward()
    np.testing.assert_allclose(g.numpy(), gt.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_no_grad_calls_and_integer_targets():
  rng = np.random.default_rng()
  for i in range(3):
    logits = rng.standard_normal((8, 5)).astype(np.float32)
    target = rng.integers(0, 5, 8)
    with fg.no_grad():
      got = fg.nn.functional.cross_entropy(fg.tensor(logits), fg.tensor(target)).item()
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(target)).item()
    assert got == pytest.approx(want, rel=1e-5)
  with pytest.raises(IndexError):    # the targets' range check still runs (a host read: never templated)
    fg.nn.functional.cross_entropy(fg.tensor(logits), fg.tensor(np.full(8, 7))).item()


def test_a_realized_constant_is_keyed_by_its_value(device):
  # fusegrad.ones(n) realized is still a CONST node, which the graph folds (x * ones is x): a template recorded
  # over it must not serve a parameter of other values later (a LayerNorm's weight after its first update)
  rng = np.random.default_rng()
  x0 = rng.standard_normal((4, 8)).astype(np.float32)
  for w0 in (np.ones(8, np.float32), rng.standard_normal(8).astype(np.float32), np.ones(8, np.float32)):
    w = (fg.ones(8, device=device) if (w0 == 1).all() else fg.tensor(w0, device=device)).realize()
    w.requires_grad_()
    x = fg.tensor(x0, device=device, requires_grad=True)
    y = fg.nn.functional.layer_norm(x, (8,), w)
    (y * x).sum().backward()
    xt, wt = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    yt = torch.nn.functional.layer_norm(xt, (8,), wt)
    (yt * xt).sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_view_input_is_keyed_with_its_source(device):
  # softmax over x.T builds on x.T's source (movements compose into one view of it): the template must read the
  # source of each call, a constant's value included
  rng = np.random.default_rng()
  for i, base in enumerate((None, 2.0, None, 3.0, None)):
    a = rng.standard_normal((5, 7)).astype(np.float32) if base is None else np.full((5, 7), base, np.float32)
    x = fg.full((5, 7), base, device=device) if base is not None else fg.tensor(a, device=device)
    y = x.T.softmax(-1).numpy()
    np.testing.assert_allclose(y, torch.tensor(a).T.softmax(-1).numpy(), rtol=1e-5, atol=1e-6)


# ---- optimizer update templates (fusegrad/optim/_updates.py) -------------------------------------------------

_OPTS = {"SGD": dict(lr=0.1, momentum=0.9, nesterov=True), "Adam": dict(lr=1e-2, amsgrad=True),
         "AdamW": dict(lr=1e-2), "RMSprop": dict(lr=1e-2, centered=True, momentum=0.5),
         "Adagrad": dict(lr=0.1, initial_accumulator_value=0.3), "Adadelta": {}, "Adamax": {}, "NAdam": {},
         "RAdam": {}, "ASGD": {}}


def _opt_steps(name: str, templates: bool, seed: int, steps: int = 6):
  config.TEMPLATES = templates
  rng = np.random.default_rng(seed)
  fg.manual_seed(0)
  model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 5))
  opt = getattr(fg.optim, name)(model.parameters(), **_OPTS[name])
  sched = fg.optim.lr_scheduler.StepLR(opt, 1, 0.7)    # a new learning rate every step: no new key
  for _ in range(steps):
    x, y = rng.standard_normal((8, 12), dtype=np.float32), rng.integers(0, 5, 8)
    loss = F.cross_entropy(model(fg.tensor(x)), fg.tensor(y))
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
  states = [v.numpy() for st in opt.state.values() for k, v in sorted(st.items()) if isinstance(v, fg.Tensor)]
  return [p.numpy() for p in model.parameters()], states


@pytest.mark.parametrize("name", list(_OPTS))
def test_optimizer_updates_from_templates_equal_the_frontend(name, monkeypatch):
  from fusegrad import templates
  from fusegrad.optim import _updates
  monkeypatch.setattr(templates, "FORWARD", False)   # (forward templates reassociate gradients: compared above)
  seed = np.random.SeedSequence().entropy
  want = _opt_steps(name, False, seed)
  hits = _updates.stats["hits"]
  got = _opt_steps(name, True, seed)
  assert _updates.stats["hits"] - hits >= 12
  for a, b in zip(got[0] + got[1], want[0] + want[1]): np.testing.assert_array_equal(a, b)


def test_a_group_value_the_update_reads_is_keyed():
  # Adagrad's first step builds its accumulator from initial_accumulator_value (a value in the graph, not in the
  # hyperparameter buffer): another value must not reuse the first one's template
  rng = np.random.default_rng()
  w0, g0 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
  for init in (0.3, 0.3, 2.0, 0.0, 2.0):
    w = fg.tensor(w0, requires_grad=True)
    opt = fg.optim.Adagrad([w], lr=0.1, initial_accumulator_value=init)
    (w * fg.tensor(g0)).sum().backward()
    opt.step()
    wt = torch.tensor(w0, requires_grad=True)
    optt = torch.optim.Adagrad([wt], lr=0.1, initial_accumulator_value=init)
    (wt * torch.tensor(g0)).sum().backward()
    optt.step()
    np.testing.assert_allclose(w.numpy(), wt.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_random_numbers_from_templates_are_fresh_and_reproducible(device):
  # the draw's keys come from the host every call (never templated); the hashing and Box-Muller are templates
  fg.manual_seed(7)
  first = [fg.randn(3, 5, device=device).numpy() for _ in range(4)] + [fg.rand(6, device=device).numpy()]
  fg.manual_seed(7)
  again = [fg.randn(3, 5, device=device).numpy() for _ in range(4)] + [fg.rand(6, device=device).numpy()]
  for a, b in zip(first, again): np.testing.assert_array_equal(a, b)
  for a, b in zip(first[:3], first[1:4]): assert not np.array_equal(a, b)
  config.TEMPLATES = False
  fg.manual_seed(7)
  plain = [fg.randn(3, 5, device=device).numpy() for _ in range(4)] + [fg.rand(6, device=device).numpy()]
  for a, b in zip(first, plain): np.testing.assert_array_equal(a, b)
  big = fg.randn(20000, device=device).numpy()
  assert abs(big.mean()) < 0.05 and abs(big.std() - 1) < 0.05


# ---- batch norm: a templated core of several outputs (y and the new running statistics) ------------------------

_BN_CASES = {
  "2d": ("BatchNorm2d", (4, 3, 5, 5), {}),
  "1d_rows": ("BatchNorm1d", (6, 3), {}),
  "1d_seq": ("BatchNorm1d", (4, 3, 7), {"eps": 1e-3, "momentum": 0.3}),
  "cumulative": ("BatchNorm2d", (2, 3, 4, 4), {"momentum": None}),
  "untracked": ("BatchNorm2d", (3, 3, 4, 4), {"track_running_stats": False}),
  "no_affine": ("BatchNorm1d", (5, 3, 4), {"affine": False}),
  "no_bias": ("BatchNorm2d", (2, 3, 3, 3), {"bias": False}),
  "float16": ("BatchNorm2d", (4, 3, 5, 5), {"dtype": "float16"}),
}


def _bn_steps(lib, case: str, templates: bool, seed: int, steps: int = 5):
  """Training steps of a parameter -> BatchNorm -> loss model (then one eval forward): the losses, the input's
  gradient, the parameters, the running statistics and the eval output, as numpy arrays."""
  cls, shape, kw = _BN_CASES[case]
  config.TEMPLATES = templates
  kw = dict(kw)
  dtype = getattr(lib, kw.pop("dtype", "float32"))
  rng = np.random.default_rng(seed)
  torch.manual_seed(0)
  bn = getattr(lib.nn, cls)(shape[1], **kw).to(dtype=dtype)
  x = lib.tensor((rng.standard_normal(shape) * 3 + 1).astype(np.float32)).to(dtype).requires_grad_()
  w = lib.tensor(rng.standard_normal(shape[2:] or (1,)).astype(np.float32)).to(dtype)
  if bn.weight is not None:
    with lib.no_grad():
      bn.weight.copy_(lib.tensor(rng.standard_normal(shape[1]).astype(np.float32) + 1))
  opt = lib.optim.SGD([x, *bn.parameters()], lr=0.05, momentum=0.9)
  losses, xgrads = [], []
  for _ in range(steps):
    y = bn(x)
    loss = (y * y * w).float().mean()
    opt.zero_grad()
    loss.backward()
    xgrads.append(x.grad.float().numpy().copy())
    opt.step()
    losses.append(loss.item())
  bn.eval()
  with lib.no_grad(): ev = bn(x).float().numpy()
  params = [p.detach().float().numpy() for p in [x, *bn.parameters()]]
  buffers = [b.numpy().astype(np.float64) for b in bn.buffers()]
  return losses, xgrads, params, buffers, ev


@pytest.mark.parametrize("case", list(_BN_CASES))
def test_batchnorm_from_a_template_equals_the_frontend(case):
  # the templated core returns (y, new running_mean, new running_var); batch_norm writes the statistics itself:
  # bitwise the frontend's run over several steps, running statistics and an eval forward included
  seed = int(np.random.SeedSequence().entropy % 2**32)
  want = _bn_steps(fg, case, False, seed)
  hits = FT.stats["hits"]
  with fg.track() as tr_got:
    got = _bn_steps(fg, case, True, seed)
  # (the first step reads the initial constant statistics, the second realized ones: steps 3-5 are hits)
  if case != "cumulative": assert FT.stats["hits"] - hits >= 3, "the steps did not come from a template"
  else: assert FT.stats["hits"] - hits <= 1    # a new constant momentum every step: not templated (but the eval)
  for a, b in zip(got, want):
    for u, v in zip(a, b): np.testing.assert_array_equal(u, v)
  theirs = _bn_steps(torch, case, False, seed)
  tol = 2e-2 if case == "float16" else 2e-4
  np.testing.assert_allclose(got[0], theirs[0], rtol=tol, atol=tol)
  for a, b in zip(got[1:], theirs[1:]):
    for u, v in zip(a, b): np.testing.assert_allclose(u, v, rtol=tol, atol=tol * max(1.0, np.abs(v).max()))


def test_batchnorm_from_a_template_launches_no_more_kernels(device):
  # the running statistics are computed in the step's schedule, as on the frontend's path
  rng = np.random.default_rng()
  counts = []
  for templates in (False, True, True, True):
    config.TEMPLATES = templates
    fg.manual_seed(0)
    bn = nn.BatchNorm2d(3).to(device)
    x = fg.tensor(rng.standard_normal((4, 3, 5, 5)).astype(np.float32), device=device, requires_grad=True)
    hits = FT.stats["hits"]
    with fg.track() as tr:
      y = bn(x)
      (y * y).sum().backward()
      fg.realize(y, x.grad, bn.weight.grad, bn.bias.grad, bn.running_mean, bn.running_var)
    if templates and len(counts) >= 2: assert FT.stats["hits"] > hits
    counts.append(len(tr.kernels))
  assert counts[-1] <= counts[0], counts


def test_double_backward_through_a_templated_batch_norm():
  rng = np.random.default_rng()
  x0, w0 = rng.standard_normal((6, 3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32) + 1
  results = []
  for templates in (False, True, True, True):
    config.TEMPLATES = templates
    x, w = fg.tensor(x0, requires_grad=True), fg.tensor(w0, requires_grad=True)
    rm, rv = fg.zeros(3), fg.ones(3)
    hits = FT.stats["hits"]
    y = F.batch_norm(x, rm, rv, w, None, training=True)
    if templates and len(results) >= 2: assert FT.stats["hits"] == hits + 1
    (g,) = fg.autograd.grad((y * y * y).sum(), [x], create_graph=True)
    g.square().sum().backward()
    results.append((g.numpy(), w.grad.numpy(), x.grad.numpy(), rm.numpy(), rv.numpy()))
  xt, wt = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
  rmt, rvt = torch.zeros(3), torch.ones(3)
  yt = torch.nn.functional.batch_norm(xt, rmt, rvt, wt, None, training=True)
  (gt,) = torch.autograd.grad((yt * yt * yt).sum(), [xt], create_graph=True)
  gt.square().sum().backward()
  for got in results:
    for a, b in zip(got, (gt.detach(), wt.grad, xt.grad, rmt, rvt)):
      np.testing.assert_allclose(a, b.numpy(), rtol=1e-3, atol=1e-3 * max(1.0, np.abs(b.numpy()).max()))
  # the first gradient and the statistics bitwise; the second backward reaches w and x both through the FN recipe
  # of y and through the recipes the rule's create_graph run left: the same terms, added in another order
  for got in results[1:]:
    for k in (0, 3, 4): np.testing.assert_array_equal(got[k], results[0][k])
    for k in (1, 2): np.testing.assert_allclose(got[k], results[0][k], rtol=1e-6, atol=1e-6 * np.abs(results[0][k]).max())


def test_a_templated_function_of_several_outputs():
  # each output that needs a gradient gets its own FN recipe naming its place; an output under no_grad gets none;
  # gradients through both outputs add up at the inputs
  @FT.templated
  def parts(x, w):
    a = (x * w).tanh()
    with fg.no_grad(): s = (x * 2).sum(0)
    return a, a.sum(-1) * x.mean(-1), s
  rng = np.random.default_rng()
  x0, w0 = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
  results = []
  for templates in (False, True, True, True):
    config.TEMPLATES = templates
    hits = FT.stats["hits"]
    x, w = fg.tensor(x0, requires_grad=True), fg.tensor(w0, requires_grad=True)
    a, b, s = parts(x, w)
    assert a.requires_grad and b.requires_grad and not s.requires_grad
    if templates and len(results) >= 2:
      assert FT.stats["hits"] == hits + 1 and a._ctx[1][2] == 0 and b._ctx[1][2] == 1
    ((a * a).sum() + (b * 3).sum()).backward()
    results.append((a.numpy(), b.numpy(), s.numpy(), x.grad.numpy(), w.grad.numpy()))
  xt, wt = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
  at = (xt * wt).tanh()
  bt = at.sum(-1) * xt.mean(-1)
  ((at * at).sum() + (bt * 3).sum()).backward()
  for got in results:
    for u, v in zip(got, (at, bt, (torch.tensor(x0) * 2).sum(0), xt.grad, wt.grad)):
      np.testing.assert_allclose(u, v.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_a_layer_called_again_on_the_same_input_comes_from_its_template(rng):
  """Calling a templated layer on the same input while the last call's graph is alive: hash-consing hands the call
  nodes the last call made (a function of the inputs), which the template records as its own entries, so later
  calls come from the template (BatchNorm2d's training call ran its ~20 frontend ops every time). Outputs, running
  statistics and input gradients equal the untemplated path's, bitwise, and PyTorch's."""
  a = rng.standard_normal((8, 16, 4, 4)).astype(np.float32)
  got = {}
  for templates in (False, True):
    config.TEMPLATES = templates
    try:
      bn = nn.BatchNorm2d(16)
      x = fg.tensor(a, requires_grad=True)
      hits, ys = FT.stats["hits"], []
      for _ in range(4):
        y = bn(x)                       # the last y (and its graph) alive while the next call runs
        (y * y).sum().backward()
        ys.append(y.numpy())
      if templates: assert FT.stats["hits"] - hits >= 2, "the calls did not come from a template"
      got[templates] = (np.stack(ys), bn.running_mean.numpy(), bn.running_var.numpy(), x.grad.numpy())
    finally:
      config.TEMPLATES = True
  for u, t in zip(got[False], got[True]): np.testing.assert_array_equal(u, t)
  tbn, tx = torch.nn.BatchNorm2d(16), torch.tensor(a, requires_grad=True)
  for _ in range(4): (tbn(tx) ** 2).sum().backward()
  np.testing.assert_allclose(got[True][1], tbn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[True][2], tbn.running_var.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[True][3], tx.grad.numpy(), rtol=1e-4, atol=1e-4)
