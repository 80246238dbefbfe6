"""Hooks and optimizer state as torch has them: Tensor.register_hook / register_post_accumulate_grad_hook, Module's
forward pre-, forward and full backward hooks with removable handles, and `opt.state[p]` keyed by the parameter.

Each is compared with torch on fresh random inputs; the training loops run with the checked trace on and off
(a hook is Python every step must run, so a step with hooks is eager where the trace cannot replay it)."""
from __future__ import annotations
import collections
import numpy as np
import pytest
import torch
import fusegrad as fg
import fusegrad.nn as nn
from fusegrad import autograd
from trace_loops import run_both, assert_same


def _close(a, b, rtol=1e-5, atol=1e-6):
  a = a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a
  b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _pair(rng, i: int, o: int):
  """An fg Linear and a torch Linear with the same weights."""
  f = nn.Linear(i, o)
  t = torch.nn.Linear(i, o)
  with torch.no_grad():
    t.weight.copy_(torch.tensor(rng.standard_normal((o, i), dtype=np.float32)))
    t.bias.copy_(torch.tensor(rng.standard_normal(o, dtype=np.float32)))
  f.weight.data = fg.tensor(t.weight.detach().numpy().copy())
  f.bias.data = fg.tensor(t.bias.detach().numpy().copy())
  return f, t


# ---- tensor hooks ----------------------------------------------------------------------------------------------

def test_tensor_hooks_scale_clip_and_see_gradients_as_torch(rng):
  x = rng.standard_normal((4, 5), dtype=np.float32)
  res = {}
  for lib in (fg, torch):
    a = lib.tensor(x, requires_grad=True)
    b = (a * 1.5).sin()
    seen = []
    b.register_hook(lambda g: seen.append(g.detach().numpy().copy()))   # returns None: the gradient stays
    b.register_hook(lambda g: g * 3)                                      # chained: the next hook sees g * 3
    b.register_hook(lambda g: seen.append(g.detach().numpy().copy()))
    ha = a.register_hook(lambda g: g.clamp(-0.4, 0.4))                    # a leaf's, before .grad accumulates
    (b * b + a).sum().backward()
    res[lib.__name__] = (a.grad.detach().numpy().copy(), seen)
    ha.remove()                                                           # removed: the next gradient is unclipped
    a.grad = None
    (a * a).sum().backward()
    res[lib.__name__] += (a.grad.detach().numpy().copy(),)
  (fa, fs, f2), (ta, ts, t2) = res["fusegrad"], res["torch"]
  _close(fa, ta)
  assert np.abs(fa).max() <= 0.4 + 1e-7
  for u, v in zip(fs, ts): _close(u, v)
  _close(f2, t2)
  _close(f2, 2 * x)


def test_post_accumulate_grad_hook_and_errors(rng):
  x = rng.standard_normal(6).astype(np.float32)
  res = {}
  for lib in (fg, torch):
    a = lib.tensor(x, requires_grad=True)
    seen = []
    h = a.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.detach().numpy().copy()))
    (a * a).sum().backward()
    (a.exp()).sum().backward()           # accumulates: the hook sees the sum
    h.remove()
    (a * 2).sum().backward()
    res[lib.__name__] = seen, a.grad.detach().numpy().copy()
  (fs, fg_), (ts, tg) = res["fusegrad"], res["torch"]
  assert len(fs) == len(ts) == 2
  for u, v in zip(fs, ts): _close(u, v)
  _close(fg_, tg)
  a = fg.tensor(x, requires_grad=True)
  with pytest.raises(RuntimeError, match="non-leaf"): (a * 2).register_post_accumulate_grad_hook(lambda t: None)
  with pytest.raises(RuntimeError, match="doesn't require gradient"): fg.tensor(x).register_hook(lambda g: g)
  with pytest.raises(RuntimeError, match="changed the size"):
    b = a * 2
    b.register_hook(lambda g: g.sum())
    b.sum().backward()


def test_a_backward_with_hooks_is_not_made_from_a_template(rng):
  """The same backward twice: its template would be hit the second time, and skip the hook."""
  x = rng.standard_normal((3, 4), dtype=np.float32)
  w = fg.tensor(rng.standard_normal((4, 2), dtype=np.float32), requires_grad=True)
  calls = []
  for _ in range(2): (fg.tensor(x) @ w).tanh().sum().backward()   # (recorded, then a hit)
  h = w.register_hook(lambda g: calls.append(1) or g * 0.5)
  hits = autograd._templates_hits[0]
  w.grad = None
  for _ in range(3): (fg.tensor(x) @ w).tanh().sum().backward()
  assert len(calls) == 3 and autograd._templates_hits[0] == hits
  tw = torch.tensor(w.detach().numpy(), requires_grad=True)
  for _ in range(3): (torch.tensor(x) @ tw).tanh().sum().backward()
  _close(w.grad, 0.5 * tw.grad)
  h.remove()


# ---- module hooks ----------------------------------------------------------------------------------------------

def test_forward_pre_hook_and_forward_hook_as_torch(rng):
  x = rng.standard_normal((5, 6), dtype=np.float32)
  f, t = _pair(rng, 6, 3)
  out = {}
  for lib, m in (("fg", f), ("torch", t)):
    calls = collections.Counter()
    def pre(mod, args):
      calls["pre"] += 1
      assert mod is m and isinstance(args, tuple)
      return args[0] * 0.5                       # a non-tuple: wrapped as (new input,)
    def fwd(mod, args, output):
      calls["fwd"] += 1
      return output.relu() + 1
    h1, h2 = m.register_forward_pre_hook(pre), m.register_forward_hook(fwd)
    xi = (fg if lib == "fg" else torch).tensor(x, requires_grad=True)
    y = m(xi)
    (y * y).sum().backward()
    out[lib] = [y.detach().numpy().copy(), xi.grad.detach().numpy().copy(), m.weight.grad.detach().numpy().copy()]
    h1.remove(); h2.remove()
    out[lib].append(m(xi).detach().numpy().copy())
    assert calls == {"pre": 1, "fwd": 1}
  for u, v in zip(out["fg"], out["torch"]): _close(u, v, rtol=1e-5, atol=1e-5)


def test_forward_hooks_with_kwargs_and_prepend():
  class M(nn.Module):
    def forward(self, x, scale=1.0): return x * scale
  m, order = M(), []
  m.register_forward_pre_hook(lambda mod, a, kw: order.append("kw") or (a, {"scale": 3.0}), with_kwargs=True)
  m.register_forward_pre_hook(lambda mod, a: order.append("first"), prepend=True)
  m.register_forward_hook(lambda mod, a, kw, out: out + kw["scale"], with_kwargs=True)
  np.testing.assert_allclose(m(fg.tensor([1.0, 2.0])).numpy(), [6.0, 9.0])
  assert order == ["first", "kw"]


class _Two(nn.Module):
  """forward(a, k, b): k is no tensor; the output's gradient reaches a and b through different paths."""
  def forward(self, a, k, b): return a * b + (a * k).sin(), b.exp()


def _two_torch(a, k, b): return a * b + (a * k).sin(), b.exp()


class _TwoT(torch.nn.Module):
  def forward(self, a, k, b): return _two_torch(a, k, b)


@pytest.mark.parametrize("b_grad", [True, False])
def test_full_backward_hook_grad_input_and_output_as_torch(rng, b_grad):
  xa, xb = rng.standard_normal((3, 4), dtype=np.float32), rng.standard_normal((3, 4), dtype=np.float32)
  res = {}
  for lib, m in ((fg, _Two()), (torch, _TwoT())):
    seen = []
    def hook(mod, gin, gout):
      seen.append(([None if g is None else g.detach().numpy().copy() for g in gin],
                   [None if g is None else g.detach().numpy().copy() for g in gout]))
      return tuple(None if g is None else g * 2 for g in gin)     # scales what reaches the inputs
    h = m.register_full_backward_hook(hook)
    a, b = lib.tensor(xa, requires_grad=True), lib.tensor(xb, requires_grad=b_grad)
    y, z = m(a, 0.7, b)
    ((y * y).sum() + (a * 3).sum() + z.sum()).backward()   # a is also used outside: its grad_input is the module's part
    res[lib.__name__] = seen, a.grad.numpy().copy(), None if b.grad is None else b.grad.numpy().copy()
    h.remove()
    a.grad = None
    y, z = m(a, 0.7, b)
    y.sum().backward()
    res[lib.__name__] += (a.grad.numpy().copy(), len(seen))
  (fs, fa, fb, fa2, fn), (ts, ta, tb, ta2, tn) = res["fusegrad"], res["torch"]
  assert fn == tn == 1
  (fgin, fgout), (tgin, tgout) = fs[0], ts[0]
  assert len(fgin) == len(tgin) == 3 and len(fgout) == len(tgout) == 2
  for u, v in zip(fgin + fgout, tgin + tgout):
    assert (u is None) == (v is None)
    if u is not None: _close(u, v)
  # a tensor input without a gradient: zeros (torch's); an output that needs none: None
  assert fgin[1] is None and (fgout[1] is None) == (not b_grad) and (fgin[2] == 0).all() == (not b_grad)
  _close(fa, ta)
  assert (fb is None) == (tb is None)
  if fb is not None: _close(fb, tb)
  _close(fa2, ta2)


def test_full_backward_hook_sees_every_input_gradient_complete(rng):
  """Inputs on separate paths: the backward's walk may reach one input's identity before the other input's gradient
  is complete; the hook still sees both complete, once (autograd._grouped), as torch's."""
  xs = [rng.standard_normal(5).astype(np.float32) for _ in range(3)]
  res = {}
  for lib in (fg, torch):
    class M((nn if lib is fg else torch.nn).Module):
      def forward(self, a, b, c): return a * 2, (b * c).tanh(), c.exp() * a
    m, seen = M(), []
    m.register_full_backward_hook(lambda mod, gi, go: seen.append([g.detach().numpy().copy() for g in gi + go]) or
                                  tuple(g * g for g in gi))
    a, b, c = [lib.tensor(x, requires_grad=True) for x in xs]
    ys = m((a * 0.5).cos(), b, c)
    sum((y * y * (i + 1)).sum() for i, y in enumerate(ys)).backward()
    res[lib.__name__] = seen + [[a.grad.numpy().copy(), b.grad.numpy().copy(), c.grad.numpy().copy()]]
  assert len(res["fusegrad"]) == len(res["torch"]) == 2
  for us, vs in zip(res["fusegrad"], res["torch"]):
    for u, v in zip(us, vs): _close(u, v)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_full_backward_hook_without_input_gradients(rng):
  """The first layer's input needs no gradient: torch calls the hook with grad_input (None,) at the output's time."""
  x = rng.standard_normal((4, 6), dtype=np.float32)
  f, t = _pair(rng, 6, 3)
  got = {}
  for lib, m in (("fg", f), ("torch", t)):
    seen = []
    m.register_full_backward_hook(lambda mod, gin, gout: seen.append((gin, gout[0].detach().numpy().copy())))
    mod = (fg if lib == "fg" else torch)
    m(mod.tensor(x)).square().sum().backward()
    got[lib] = seen
  assert len(got["fg"]) == len(got["torch"]) == 1
  assert got["fg"][0][0] == (None,) == got["torch"][0][0]
  _close(got["fg"][0][1], got["torch"][0][1])


# ---- training loops --------------------------------------------------------------------------------------------

def _loop(lib, rng_state, steps: int, hooks: bool):
  """A 2-layer MLP with SGD(momentum) for `steps` steps: a forward hook that changes the output, a pre-hook that
  changes the input, a full backward hook clipping grad_input, a tensor hook scaling a parameter's gradient, a
  post-accumulate hook counting; (losses, parameters, hook call counts)."""
  rng = np.random.default_rng(rng_state)
  xs = rng.standard_normal((steps, 8, 6), dtype=np.float32)
  ys = rng.standard_normal((steps, 8, 2), dtype=np.float32)
  w1, b1 = rng.standard_normal((10, 6), dtype=np.float32) * 0.3, rng.standard_normal(10, dtype=np.float32) * 0.1
  w2, b2 = rng.standard_normal((2, 10), dtype=np.float32) * 0.3, rng.standard_normal(2, dtype=np.float32) * 0.1
  N = nn if lib is fg else torch.nn
  m = N.Sequential(N.Linear(6, 10), N.Tanh(), N.Linear(10, 2))
  for p, v in zip(m.parameters(), (w1, b1, w2, b2)):
    if lib is fg: p.data = fg.tensor(v)
    else:
      with torch.no_grad(): p.copy_(torch.tensor(v))
  opt = lib.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
  calls = collections.Counter()
  if hooks:
    m[0].register_forward_pre_hook(lambda mod, a: calls.update(["pre"]) or (a[0] * 1.25,))
    m[2].register_forward_hook(lambda mod, a, out: calls.update(["fwd"]) or out * 0.5 + 0.1)
    m[2].register_full_backward_hook(lambda mod, gi, go: calls.update(["bwd"]) or (gi[0].clamp(-0.02, 0.02),))
    m[0].weight.register_hook(lambda g: calls.update(["tensor"]) or g * 0.3)
    m[2].bias.register_post_accumulate_grad_hook(lambda p: calls.update(["post"]))
  losses = []
  for i in range(steps):
    opt.zero_grad()
    loss = ((m(lib.tensor(xs[i])) - lib.tensor(ys[i])) ** 2).mean()
    loss.backward()
    opt.step()
    losses.append(np.float32(loss.item()))
  return losses, [p.detach().numpy().copy() for p in m.parameters()], calls


def test_hooks_over_a_training_loop_as_torch(traced):
  seed = int(np.random.default_rng().integers(1 << 31))
  for on in (False, True):
    traced(on)
    fl, fp, fc = _loop(fg, seed, 6, True)
    tl, tp, tc = _loop(torch, seed, 6, True)
    assert fc == tc == {"pre": 6, "fwd": 6, "bwd": 6, "tensor": 6, "post": 6}
    np.testing.assert_allclose(fl, tl, rtol=1e-5, atol=1e-6)
    for u, v in zip(fp, tp): _close(u, v, rtol=1e-5, atol=1e-6)
    plain, _p, _c = _loop(fg, seed, 6, False)
    assert not np.allclose(plain[1:], fl[1:])   # (the hooks changed the trajectory)


def test_a_forward_hook_under_the_eager_trace(traced, rng):
  """Forward hooks run every step with the trace on, and the steps are eager's bitwise (the hook's tensor ops are
  recorded like any call); a step whose parameter has a tensor hook is eager's too, and calls the hook every step."""
  xs = [rng.standard_normal((8, 6), dtype=np.float32) for _ in range(2)]
  calls = collections.Counter()
  def make(tensor_hook: bool):
    def mk():
      m = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
      m[0].register_forward_hook(lambda mod, a, out: calls.update(["fwd"]) or out * 1.5)
      m[2].register_forward_pre_hook(lambda mod, a: calls.update(["pre"]) or None)
      if tensor_hook: m[2].weight.register_hook(lambda g: calls.update(["tensor"]) or g.clamp(-0.01, 0.01))
      return m, fg.optim.Adam(m.parameters(), lr=1e-2)
    return mk
  def body(m, opt, i):
    opt.zero_grad()
    h = m(fg.tensor(xs[i % 2]))
    loss = h.square().mean()
    loss.backward()
    opt.step()
    return [np.float32(loss.item()), m[2].weight.grad.numpy().copy()]
  for tensor_hook in (False, True):
    calls.clear()
    off, on, d = run_both(traced, make(tensor_hook), 8, body)
    assert_same(off, on)
    assert calls["fwd"] == calls["pre"] == 16 and calls["tensor"] == (16 if tensor_hook else 0)
    if not tensor_hook: assert d["replays"] >= 3, d
    else: assert d["replays"] == 0, d


def test_jit_refuses_a_step_with_hooks(rng):
  x = fg.tensor(rng.standard_normal((4, 3), dtype=np.float32))
  for kind in ("tensor", "module"):
    m = nn.Linear(3, 2)
    opt = fg.optim.SGD(m.parameters(), lr=0.1)
    if kind == "tensor": m.weight.register_hook(lambda g: g * 2)
    else: m.register_forward_hook(lambda mod, a, out: out * 2)
    @fg.jit
    def step(x):
      opt.zero_grad()
      loss = m(x).square().sum()
      loss.backward()
      opt.step()
      return loss
    with pytest.raises(RuntimeError, match="hooks"):
      for _ in range(3): step(x)


# ---- optimizer state keyed by the parameter --------------------------------------------------------------------

def test_adam_state_keyed_by_parameter_as_torch(rng):
  f, t = _pair(rng, 5, 4)
  fo, to = fg.optim.Adam(f.parameters(), lr=1e-2), torch.optim.Adam(t.parameters(), lr=1e-2)
  xs = rng.standard_normal((5, 6, 5), dtype=np.float32)
  for i in range(3):
    for lib, m, o in ((fg, f, fo), (torch, t, to)):
      o.zero_grad()
      m(lib.tensor(xs[i])).tanh().sum().backward()
      o.step()
  assert isinstance(fo.state, collections.defaultdict)
  for fp, tp in zip(f.parameters(), t.parameters()):
    assert fp in fo.state and fo.state[fp] is fo.state[id(fp)]   # (an id is still accepted)
    for k in ("exp_avg", "exp_avg_sq"): _close(fo.state[fp][k], to.state[tp][k], rtol=1e-5, atol=1e-7)
    assert fo.state[fp]["step"] == int(to.state[tp]["step"]) == 3
  assert list(fo.state) == list(f.parameters())
  # state_dict round trip: a fresh optimizer loaded from it continues as the original does
  f2 = nn.Linear(5, 4)
  for p2, p in zip(f2.parameters(), f.parameters()): p2.data = p.detach().clone()
  fo2 = fg.optim.Adam(f2.parameters(), lr=1e-2)
  fo2.load_state_dict(fo.state_dict())
  for p2, p in zip(f2.parameters(), f.parameters()):
    _close(fo2.state[p2]["exp_avg"], fo.state[p]["exp_avg"])
  for i in range(3, 5):
    for lib, m, o in ((fg, f, fo), (fg, f2, fo2), (torch, t, to)):
      o.zero_grad()
      m(lib.tensor(xs[i])).tanh().sum().backward()
      o.step()
  for p, p2, tp in zip(f.parameters(), f2.parameters(), t.parameters()):
    np.testing.assert_array_equal(p.detach().numpy(), p2.detach().numpy())
    _close(p, tp, rtol=1e-5, atol=1e-6)
  sd = fo.state_dict()
  assert sorted(sd["state"]) == [0, 1] and set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
  fresh = fg.optim.SGD(f.parameters(), lr=0.1)
  w = next(f.parameters())
  assert w not in fresh.state and fresh.state.get(id(w)) is None and len(fresh.state[w]) == 0   # defaultdict(dict)
