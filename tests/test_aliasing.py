"""Views share storage with their base, in-place ops reach every alias, and autograd's version counters:
each case runs on fusegrad and on torch and compares values, gradients and errors."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import fusegrad as fg
from fusegrad import nn


def _pair(rng, shape, device="CPU", requires_grad=False):
  a = rng.standard_normal(shape).astype(np.float32)
  return fg.tensor(a, device=device, requires_grad=requires_grad), torch.tensor(a, requires_grad=requires_grad)


def _close(ours, theirs, **kw):
  theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
  assert tuple(ours.shape) == tuple(theirs.shape)
  np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-6, atol=1e-6, **kw)


# ---- in-place through a view reaches the base --------------------------------------------------------

def _setitem_on_view(x, row):
  v = x[1:3]
  v[0, 2] = 100.0
  return v


WRITES = {
  "slice_add": lambda x, row: x[1:3].add_(1),
  "row_copy": lambda x, row: x[0].copy_(row),
  "view_slice": lambda x, row: x.view(24)[5:10].mul_(2),
  "reshape_row": lambda x, row: x.reshape(6, 4)[2].fill_(3),
  "t_row": lambda x, row: x.t()[1].fill_(-1),
  "transpose_slice": lambda x, row: x.transpose(0, 1)[2:4].mul_(0),
  "permute_stepped": lambda x, row: x.permute(1, 0)[::2].add_(5),
  "column_step": lambda x, row: x[:, 1:5:2].fill_(2),
  "unsqueeze": lambda x, row: x.unsqueeze(0)[0, 1].zero_(),
  "squeeze": lambda x, row: x[1:2].squeeze(0).mul_(-3),
  "flatten": lambda x, row: x.flatten()[7:9].sub_(4),
  "chain": lambda x, row: x[1:3].t()[0].fill_(7),
  "narrow": lambda x, row: x.narrow(1, 2, 3).mul_(-1),
  "split": lambda x, row: x.split(2, 1)[1].add_(1),
  "chunk": lambda x, row: x.chunk(2, 0)[1].div_(2),
  "unbind": lambda x, row: x.unbind(1)[3].fill_(8),
  "select": lambda x, row: x.select(1, 4).clamp_(-0.1, 0.1),
  "iadd_index": lambda x, row: x[1][2:4].__iadd__(1),
  "detach": lambda x, row: x.detach().mul_(2),
  "data": lambda x, row: x.data.add_(1),
  "setitem": _setitem_on_view,
  "exp_": lambda x, row: x[2].exp_(),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_a_write_through_a_view_reaches_the_base(rng, device, name):
  x, tx = _pair(rng, (4, 6), device)
  row = rng.standard_normal(6).astype(np.float32)
  v = WRITES[name](x, fg.tensor(row, device=device))
  tv = WRITES[name](tx, torch.tensor(row))
  _close(x, tx)
  _close(v, tv)


def test_views_taken_before_an_inplace_op_on_the_base_see_it(rng, device):
  x, tx = _pair(rng, (4, 6), device)
  def views(x): return [x[1:3], x.t(), x.view(-1), x.detach(), x.expand(2, 4, 6), x[:, ::2], x[1:3].t()[0], x.data]
  vs, tvs = views(x), views(tx)
  for f in (lambda x: x.add_(1), lambda x: x.mul_(2), lambda x: x.__setitem__(0, 7.0), lambda x: x[:, 1].fill_(-2)):
    f(x), f(tx)
    for v, tv in zip(vs, tvs): _close(v, tv)


def test_sibling_views_see_each_others_writes(rng, device):
  x, tx = _pair(rng, (4, 6), device)
  def go(x):
    a, b, c = x[0:2], x.view(2, 12), x.t()
    a.add_(1)
    c[5].mul_(3)
    b[1, 3:7].zero_()
    return a, b, c
  for v, tv in zip(go(x), go(tx)): _close(v, tv)
  _close(x, tx)


def test_a_view_outlives_its_base(rng, device):
  x, tx = _pair(rng, (4, 6), device)
  v, tv = x[1:3], tx[1:3]
  w, tw = x.t(), tx.t()
  del x, tx
  v.add_(5), tv.add_(5)
  _close(w, tw)


def test_writing_through_an_expanded_view_is_refused(device):
  x = fg.zeros(4, 6, device=device)
  msg = "more than one element of the written-to tensor refers to a single memory location"
  with pytest.raises(RuntimeError, match=msg): x.expand(3, 4, 6).add_(1)
  with pytest.raises(RuntimeError, match=msg): x[0:1].expand(4, 6).fill_(0)
  with pytest.raises(RuntimeError, match=msg): torch.zeros(4, 6).expand(3, 4, 6).add_(1)
  np.testing.assert_array_equal(x.numpy(), np.zeros((4, 6), np.float32))


def test_copies_are_no_views(rng):
  # ops that copy in torch (repeat, flip, clone, a reduction over nothing) give tensors of their own
  x, tx = _pair(rng, (1, 4))
  def go(x):
    x.repeat(2, 1)[0].fill_(5)
    x.flip(1).add_(1)
    x.clone().mul_(0)
    x.sum(0).add_(3)
    return x
  _close(go(x), go(tx))


# ---- parameters, detach and state dicts ---------------------------------------------------------------

def test_detach_fill_changes_a_parameter(rng):
  lin = nn.Linear(3, 2)
  lin.weight.detach().fill_(0.5)
  lin.bias.data.zero_()
  np.testing.assert_array_equal(lin.weight.numpy(), np.full((2, 3), 0.5, np.float32))
  np.testing.assert_array_equal(lin.bias.numpy(), np.zeros(2, np.float32))
  assert lin.weight.requires_grad and lin.weight.is_leaf
  x = rng.standard_normal((5, 3)).astype(np.float32)
  lin(fg.tensor(x)).sum().backward()
  np.testing.assert_allclose(lin.weight.grad.numpy(), np.tile(x.sum(0), (2, 1)), rtol=1e-5)


def test_state_dict_entries_alias_the_module(rng):
  model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
  tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
  sd = model.state_dict()
  for k, v in tmodel.state_dict().items():   # the from_pretrained idiom: copy into the entries
    with fg.no_grad(): sd[k].copy_(fg.tensor(v.numpy()))
  for (k, p), tp in zip(model.state_dict().items(), tmodel.state_dict().values()): _close(p, tp, err_msg=k)
  x = rng.standard_normal((6, 3)).astype(np.float32)
  _close(model(fg.tensor(x)), tmodel(torch.tensor(x)))
  # and the other way: the entries follow the module (an optimizer step, a forward's running statistics)
  opt, topt = fg.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(tmodel.parameters(), lr=0.1)
  tsd = tmodel.state_dict()
  model(fg.tensor(x)).sum().backward(), tmodel(torch.tensor(x)).sum().backward()
  opt.step(), topt.step()
  for k in tsd: _close(sd[k], tsd[k], err_msg=k)
  # load_state_dict copies into the storage the entries share
  model.load_state_dict({k: fg.zeros_like(v) for k, v in sd.items()})
  assert all(np.all(v.numpy() == 0) for v in sd.values())


def test_module_to_gives_new_storage():
  lin = nn.Linear(3, 2)
  sd = lin.state_dict()
  before = sd["weight"].numpy().copy()
  lin.double()
  with fg.no_grad(): lin.weight.add_(1)
  assert sd["weight"].dtype == fg.float32 and lin.weight.dtype == fg.float64
  np.testing.assert_array_equal(sd["weight"].numpy(), before)   # torch: the old entries keep the old storage


def test_data_set_keeps_requires_grad_and_shares_the_new_storage():
  p, tp = fg.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
  y, ty = fg.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0])
  p.data, tp.data = y, ty
  assert p.requires_grad and p.is_leaf
  (p * p).sum().backward(), (tp * tp).sum().backward()
  _close(p.grad, tp.grad)
  with fg.no_grad(): p.mul_(10)
  with torch.no_grad(): tp.mul_(10)
  _close(y, ty)
  _close(p, tp)


# ---- autograd through writes ----------------------------------------------------------------------------

def _grads(rng, shape, fn):
  """fn(lib, a) -> loss, on fusegrad and torch: returns both gradients of a."""
  a = rng.standard_normal(shape).astype(np.float32)
  x, tx = fg.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  fn(fg, x).backward(), fn(torch, tx).backward()
  return x.grad, tx.grad


GRAD_CASES = {
  "mul_": lambda lib, a: (lambda b: (b.mul_(3), b.sum())[1])(a * 2),
  "consumer_before_write": lambda lib, a: (lambda b, c: (b.mul_(3), c.sum())[1])(*(lambda b: (b, b + 1))(a * 2)),
  "exp_": lambda lib, a: (lambda b: (b.exp_(), (b * b).sum())[1])(a * 0.5),
  "pow_": lambda lib, a: (lambda b: (b.pow_(2), b.sum())[1])(a * 2),
  "div_self": lambda lib, a: (lambda b: (b.div_(b + 3), b.sum())[1])(a * 2),
  "view_mul_": lambda lib, a: (lambda b: (b[1:3].mul_(3), (b * b).sum())[1])(a * 2),
  "chain_view": lambda lib, a: (lambda b: (b.t()[1].mul_(3), (b.sin()).sum())[1])(a * 2),
  "setitem_grad": lambda lib, a: (lambda b: (b.__setitem__((slice(0, 2), 1), a[0:2, 0] * 5), (b * b).sum())[1])(a * 1.5),
  "copy_into_zeros": lambda lib, a: (lambda z: (z[1:3].copy_(a[0:2] * 3), (z * z).sum())[1])(lib.zeros(4, 5)),
  "view_before_base_write": lambda lib, a: (lambda b, v: (b.add_(a), (v * 2).sum())[1])(*(lambda b: (b, b[2]))(a * 2)),
}


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradients_through_inplace_ops_match_torch(rng, name):
  g, tg = _grads(rng, (4, 5), GRAD_CASES[name])
  np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-5, atol=1e-6)


def _saved_modified(lib, kind):
  a = lib.ones(3, requires_grad=True)
  b = a * 2
  if kind == "output":
    c = b.exp()
    c.add_(1)
    return c.sum()
  if kind == "output_detached":
    c = b.exp()
    c.detach().zero_()
    return c.sum()
  c = (b * b).sum()
  if kind == "add_": b.add_(1)
  elif kind == "exp_": b.exp_()
  elif kind == "setitem": b[0] = 10.0
  elif kind == "view": b[1:].mul_(2)
  elif kind == "detached": b.detach().add_(1)
  elif kind == "transposed": b.view(3, 1).t()[0, 1:].zero_()
  return c


@pytest.mark.parametrize("kind", ["add_", "exp_", "setitem", "view", "detached", "transposed", "output",
                                  "output_detached"])
def test_modifying_a_saved_value_raises_like_torch(kind):
  msg = "modified by an inplace operation"
  with pytest.raises(RuntimeError, match=msg): _saved_modified(torch, kind).backward()
  with pytest.raises(RuntimeError, match=msg + r".*is at version 1; expected version 0"):
    _saved_modified(fg, kind).backward()


def test_an_unsaved_value_may_be_modified():
  for lib in (fg, torch):   # b is only added: nothing saved it, torch does not raise
    a = lib.ones(3, requires_grad=True)
    b = a * 2
    c = (b + 1).sum()
    b.mul_(5)
    c.backward()
    np.testing.assert_array_equal(np.asarray(a.grad.tolist()), [2.0, 2.0, 2.0])


def test_version_counts_name_the_versions():
  a = fg.ones(3, requires_grad=True)
  b = a * 2
  c = (b * b).sum()
  b.add_(1)
  b.add_(1)
  b[0] = 3.0
  with pytest.raises(RuntimeError, match=r"output 0 of Where, is at version 3; expected version 0"): c.backward()


def test_inplace_on_a_view_of_a_leaf_that_requires_grad_is_refused():
  a = fg.ones(4, requires_grad=True)
  with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used in an in-place"):
    a[1:3].mul_(3)
  with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
    a.mul_(3)
  with fg.no_grad(): a[1:3].mul_(3)   # allowed without grad mode, as in torch
  np.testing.assert_array_equal(a.numpy(), [1, 3, 3, 1])


# ---- backward twice, retain_graph, create_graph -------------------------------------------------------

def test_backward_twice_needs_retain_graph():
  msg = "Trying to backward through the graph a second time"
  for lib in (fg, torch):
    a = lib.ones(3, requires_grad=True)
    c = (a * a).sum()
    c.backward()
    with pytest.raises(RuntimeError, match=msg): c.backward()
    c = (a * 2).sum()
    c.backward(retain_graph=True)
    c.backward()
    np.testing.assert_array_equal(np.asarray(a.grad.tolist()), [6.0, 6.0, 6.0])
    with pytest.raises(RuntimeError, match=msg): c.backward()
    d = (a + 1).sum()   # nothing saved: torch runs it again
    d.backward()
    d.backward()
    np.testing.assert_array_equal(np.asarray(a.grad.tolist()), [8.0, 8.0, 8.0])
  a = fg.ones(3, requires_grad=True)
  y = (a * a).sum()
  fg.grad(y, a, retain_graph=True)
  (g,) = fg.grad(y, a)
  np.testing.assert_array_equal(g.numpy(), [2.0, 2.0, 2.0])
  with pytest.raises(RuntimeError, match=msg): fg.grad(y, a)


@pytest.mark.parametrize("f", [lambda lib, x: (x ** 3).sum(), lambda lib, x: (x.sin() * x).sum(),
                               lambda lib, x: x.exp().sum(), lambda lib, x: (x.tanh() * x.sigmoid()).sum(),
                               lambda lib, x: (x.relu() * x * x).sum()])
def test_create_graph_gives_second_derivatives(rng, f):
  a = rng.standard_normal(5).astype(np.float32)
  out = []
  for lib, grad in ((fg, fg.grad), (torch, torch.autograd.grad)):
    x = lib.tensor(a, requires_grad=True)
    (g,) = grad(f(lib, x), x, create_graph=True)
    assert g.requires_grad
    (g * g).sum().backward()
    out.append((g, x.grad))
  _close(out[0][0], out[1][0])
  np.testing.assert_allclose(out[0][1].numpy(), out[1][1].numpy(), rtol=1e-5, atol=1e-5)


def test_backward_create_graph_and_inputs():
  x, tx = fg.tensor([1.0, 2.0], requires_grad=True), torch.tensor([1.0, 2.0], requires_grad=True)
  y, ty = fg.tensor([3.0, 4.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True)
  (x * x * y).sum().backward(create_graph=True, inputs=[x])
  (tx * tx * ty).sum().backward(create_graph=True, inputs=[tx])
  assert y.grad is None and ty.grad is None
  _close(x.grad, tx.grad)
  gx = x.grad
  x.grad = None
  gx.sum().backward()
  tgx = tx.grad
  tx.grad = None
  tgx.sum().backward()
  _close(x.grad, tx.grad)
  _close(y.grad, ty.grad)


# ---- fusegrad.jit: state written through a view -----------------------------------------------------------

def test_jit_replays_a_write_through_a_view_of_state(rng):
  count = fg.zeros(2, 3)
  view = count[1]          # a view held across steps: it follows every replay
  def step(x):
    count[1, 1:].add_(x.sum())
    count.t()[0].add_(1)
    return count.sum()
  jitted = fg.jit(step)
  ref = np.zeros((2, 3), np.float32)
  for _ in range(5):
    x = rng.standard_normal(4).astype(np.float32)
    out = jitted(fg.tensor(x))
    ref[1, 1:] += x.sum()
    ref[:, 0] += 1
    np.testing.assert_allclose(out.numpy(), ref.sum(), rtol=1e-5)
    np.testing.assert_allclose(count.numpy(), ref, rtol=1e-5)
    np.testing.assert_allclose(view.numpy(), ref[1], rtol=1e-5)


def test_a_broadcast_operand_answers_to_its_version_counter():
  for lib in (fg, torch):
    a = lib.ones(3, requires_grad=True)
    b = a * 2
    w = lib.ones(2, 3, requires_grad=True)
    c = (b * w).sum()   # b is broadcast to (2, 3) for the product, which saves it for w's gradient
    b.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"): c.backward()
    a.grad = None
    c = (b * lib.ones(2, 3)).sum()   # nothing needs b's value: no error (torch saves only what it needs)
    b.add_(1)
    c.backward()
    np.testing.assert_array_equal(np.asarray(a.grad.tolist()), [4.0, 4.0, 4.0])
