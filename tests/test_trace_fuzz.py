"""A randomized program fuzzer for checked traces (engine/trace.py).

Each program is a small PyTorch-style training/inference loop put together, by a seeded RNG, from a menu of patterns
real loops use (models: Linear/activation stacks, LayerNorm, an embedding with positions and causal attention, a
conv + batch norm + pooling block, dropout, residual `out += h`, in-place relu_; losses: cross-entropy with label
smoothing or ignored classes, mse, a manual mean/sum; SGD/Adam/AdamW/RMSprop/Adagrad with param groups and lr
schedulers; loop shapes: zero_grad before or after the step, set_to_none, gradient accumulation, clipping, loss
reads every k steps, kept activations and gradients, eval steps under no_grad, an EMA of the weights, a host read in
the middle of a step, another batch size on the last step, two models alternating, hyperparameters, `p.data` and
requires_grad changed mid-run). It runs with traces off, then on, from the same seed and data, and every value the
program reads must be *bitwise* the same, except values the docs say are computed again after a replayed step (an
activation, gradient or norm kept past the step: float reassociation), compared with a tight tolerance.

Every run takes FAST programs; FUSEGRAD_TRACE_FUZZ=N adds N more (400: about 8 minutes on 2 cores). Failures found are kept below as minimized
reproducers marked xfail(strict=True); the generator's fast tier leaves their patterns out (see `_EXCLUDED`).
"""
from __future__ import annotations
import os
import random
import numpy as np
import pytest
import fusegrad as fg
import fusegrad.nn as nn
import fusegrad.nn.functional as F
from fusegrad.engine import trace
from fusegrad.runtime.cpu import is_clang
from trace_loops import run_both as _both, assert_same as _same

FAST = 40          # programs always run
MORE = int(os.environ.get("FUSEGRAD_TRACE_FUZZ", "0"))   # programs more when asked for (seeds after those)
RTOL, ATOL = 1e-5, 1e-6   # for values computed again after a replayed step

# patterns left out of the generated programs because a reproducer below tracks a failure of theirs
# (name, the value it takes instead): each names the reproducer that tracks it
_EXCLUDED = {
  ("host_read", False),     # test_fuzz_loss_read_before_backward
}


# ---- models --------------------------------------------------------------------------------------------------------

D_IN, HID, NCLS = 12, 16, 5
VOCAB, T, EMB, HEADS = 11, 6, 8, 2


class _MLP(nn.Module):
  def __init__(self, act: str, norm: bool, drop: float):
    super().__init__()
    self.fc1, self.fc2 = nn.Linear(D_IN, HID), nn.Linear(HID, NCLS)
    self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "relu_": nn.ReLU(inplace=True), "tanh": nn.Tanh()}[act]
    self.norm = nn.LayerNorm(HID) if norm else None
    self.drop = nn.Dropout(drop) if drop else None

  def forward(self, x):
    h = self.act(self.fc1(x))
    if self.norm is not None: h = self.norm(h)
    if self.drop is not None: h = self.drop(h)
    return self.fc2(h)


class _Residual(nn.Module):
  """h = relu(fc_in(x)); out = fc(h); out += h; head(out) (torchvision's residual add on the step's results)."""
  def __init__(self, inplace: bool, drop: float):
    super().__init__()
    self.fc_in, self.fc, self.head = nn.Linear(D_IN, HID), nn.Linear(HID, HID), nn.Linear(HID, NCLS)
    self.inplace = inplace
    self.drop = nn.Dropout(drop) if drop else None

  def forward(self, x):
    h = self.fc_in(x)
    h = h.relu_() if self.inplace else F.relu(h)
    out = self.fc(h)
    out += h
    if self.drop is not None: out = self.drop(out)
    return self.head(out)


class _Attn(nn.Module):
  """Token and position embeddings, one causal self-attention layer, a head over the vocabulary."""
  def __init__(self, drop: float):
    super().__init__()
    self.tok, self.pos = nn.Embedding(VOCAB, EMB), nn.Embedding(T, EMB)
    self.ln = nn.LayerNorm(EMB)
    self.qkv, self.proj, self.head = nn.Linear(EMB, 3 * EMB), nn.Linear(EMB, EMB), nn.Linear(EMB, VOCAB)
    self.drop = nn.Dropout(drop) if drop else None

  def forward(self, idx):
    b, t = idx.shape
    x = self.tok(idx) + self.pos(fg.arange(t))
    q, k, v = self.qkv(self.ln(x)).split(EMB, dim=-1)
    q, k, v = (z.view(b, t, HEADS, EMB // HEADS).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(1, 2).contiguous().view(b, t, EMB)
    if self.drop is not None: y = self.drop(y)
    return self.head(x + self.proj(y))


class _Conv(nn.Module):
  def __init__(self, pool: str, drop: float):
    super().__init__()
    self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
    self.pool = nn.MaxPool2d(2) if pool == "max" else nn.AvgPool2d(2)
    self.fc = nn.Linear(36, NCLS)
    self.drop = nn.Dropout(drop) if drop else None

  def forward(self, x):
    h = self.pool(F.relu(self.bn(self.conv(x))))
    h = h.flatten(1)
    if self.drop is not None: h = self.drop(h)
    return self.fc(h)


def _build_model(P: dict) -> nn.Module:
  k = P["model"]
  if k == "mlp": return _MLP(P["act"], P["norm"], P["drop"])
  if k == "res": return _Residual(P["inplace"], P["drop"])
  if k == "attn": return _Attn(P["drop"])
  return _Conv(P["pool"], P["drop"])


def _input_shape(P: dict, b: int) -> tuple:
  return {"mlp": (b, D_IN), "res": (b, D_IN), "attn": (b, T), "conv": (b, 3, 6, 6)}[P["model"]]


def _out_shape(P: dict, b: int) -> tuple:
  return (b, T, VOCAB) if P["model"] == "attn" else (b, NCLS)


# ---- optimizers and schedulers ------------------------------------------------------------------------------------

def _build_opt(P: dict, m: nn.Module):
  ps = list(m.parameters())
  kind, kw = P["opt"]
  cls = {"sgd": fg.optim.SGD, "adam": fg.optim.Adam, "adamw": fg.optim.AdamW, "rmsprop": fg.optim.RMSprop,
         "adagrad": fg.optim.Adagrad}[kind]
  if P["groups"]:
    h = len(ps) // 2
    params = [{"params": ps[:h]}, {"params": ps[h:], "lr": kw["lr"] * 0.5, "weight_decay": 0.02}]
  else: params = ps
  opt = cls(params, **kw)
  s = P["sched"]
  if s is None: sched = None
  elif s == "step": sched = fg.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
  elif s == "cos": sched = fg.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=P["steps"])
  else: sched = fg.optim.lr_scheduler.OneCycleLR(opt, max_lr=kw["lr"] * 2, total_steps=P["steps"] + 2,
                                                      cycle_momentum="momentum" in opt.defaults or "betas" in opt.defaults)
  return opt, sched


# ---- the generator -------------------------------------------------------------------------------------------------

def _opt_choice(r: random.Random):
  kind = r.choice(["sgd", "sgd", "adam", "adamw", "rmsprop", "adagrad"])
  if kind == "sgd":
    mom = r.choice([0.0, 0.9])
    kw = dict(lr=0.05, momentum=mom, nesterov=mom > 0 and r.random() < 0.5, weight_decay=r.choice([0.0, 1e-2]))
  elif kind in ("adam", "adamw"): kw = dict(lr=1e-2, weight_decay=r.choice([0.0, 0.05]))
  elif kind == "rmsprop": kw = dict(lr=1e-2, momentum=r.choice([0.0, 0.5]), centered=r.random() < 0.3)
  else: kw = dict(lr=0.05)
  return kind, kw


def generate(seed: int, exclude: set = frozenset()) -> dict:
  """A program's description: every choice the loop makes, drawn from one seeded RNG."""
  r = random.Random(seed)
  P: dict = {"seed": seed}
  P["model"] = r.choice(["mlp", "mlp", "res", "attn", "conv"])
  P["act"] = r.choice(["relu", "gelu", "relu_", "tanh"])
  P["norm"] = r.random() < 0.4
  P["inplace"] = r.random() < 0.5
  P["pool"] = r.choice(["max", "avg"])
  P["drop"] = r.choice([0.0, 0.0, 0.2])
  P["loss"] = r.choice(["ce", "ce_smooth", "ce_ignore", "mse", "manual_mean", "manual_sum"])
  P["opt"] = _opt_choice(r)
  P["groups"] = r.random() < 0.3
  P["steps"] = r.randint(6, 9)
  P["sched"] = r.choice([None, None, "step", "cos", "onecycle"])
  P["batch"] = 4 if P["model"] == "conv" else 8
  P["nbatches"] = r.choice([1, 2, 3])
  P["zero_before"] = r.random() < 0.6
  P["set_to_none"] = r.random() < 0.6
  P["accum"] = r.choice([1, 1, 1, 2, 3])
  P["micro_views"] = r.random() < 0.5          # micro-batches as slices of one tensor (else tensors of their own)
  P["clip"] = r.choice([None, None, "norm", "value"])
  P["read_every"] = r.choice([1, 1, 2, 3])
  P["keep_act"] = r.random() < 0.2
  P["read_grad"] = r.random() < 0.2
  P["read_norm"] = P["clip"] == "norm" and r.random() < 0.5
  P["eval_every"] = r.choice([0, 0, 2, 3])
  P["ema"] = r.choice([None, None, "mul_add", "lerp"])
  P["host_read"] = r.random() < 0.15
  P["last_batch"] = r.random() < 0.25          # another batch size on the last step
  P["two_models"] = r.random() < 0.15
  P["wd_change"] = r.random() < 0.15
  P["data_swap"] = r.random() < 0.1
  P["freeze"] = r.random() < 0.1
  P["no_grad_infer"] = r.random() < 0.1          # an inference-only loop (no optimizer)
  for k in exclude:       # a pattern a tracked failure has: turned off
    name, off = k
    P[name] = off
  if P["model"] in ("attn",) and P["accum"] == 3: P["accum"] = 2
  if P["model"] == "conv" and P["accum"] == 3: P["accum"] = 2
  return P


# ---- one run -------------------------------------------------------------------------------------------------------

class _Obs:
  """What the program read: (name, array, exact)."""
  def __init__(self): self.items: list = []
  def add(self, name: str, v, exact: bool = True): self.items.append((name, np.array(v, copy=True), exact))


def _data(P: dict, rng: np.random.Generator) -> list:
  """Per batch (x, class targets, float targets), fresh random values; the last entry has another batch size."""
  out = []
  sizes = [P["batch"]] * P["nbatches"] + [P["batch"] - 1 if P["model"] != "conv" else 3]
  for b in sizes:
    shp = _input_shape(P, b)
    if P["model"] == "attn":
      x = rng.integers(0, VOCAB, shp)
      y = rng.integers(0, VOCAB, (b, T))
    else:
      x = rng.standard_normal(shp, dtype=np.float32)
      y = rng.integers(0, NCLS, (b,))
    if P["loss"] == "ce_ignore":
      y = y.copy()
      y.reshape(-1)[::3] = -1
    out.append((x, y, rng.standard_normal(_out_shape(P, b), dtype=np.float32)))
  return out


def _loss(P: dict, out, y, t):
  k = P["loss"]
  if P["model"] == "attn" and k.startswith("ce"):
    out, y = out.reshape(-1, VOCAB), y.reshape(-1)
  if k == "ce": return F.cross_entropy(out, y)
  if k == "ce_smooth": return F.cross_entropy(out, y, label_smoothing=0.1)
  if k == "ce_ignore": return F.cross_entropy(out, y, ignore_index=-1)
  if k == "mse": return F.mse_loss(out, t)
  if k == "manual_mean": return (out - t).square().mean()
  return out.square().sum() * 0.01


def run_program(P: dict, data: list) -> _Obs:
  """The program, from its seed: every value it reads, in order."""
  fg.manual_seed(P["seed"])
  obs = _Obs()
  nm = 2 if P["two_models"] else 1
  models = [_build_model(P) for _ in range(nm)]
  infer = P["no_grad_infer"]
  opts = [None if infer else _build_opt(P, m) for m in models]
  emas = [[p.detach().clone() for p in m.parameters()] if P["ema"] else None for m in models]
  steps = P["steps"]
  mid = steps // 2
  prev = [float("inf")]

  def batch(i):
    if P["last_batch"] and i == steps - 1: x, y, t = data[-1]
    else: x, y, t = data[i % P["nbatches"]]
    return x, y, t

  for i in range(steps):
    j = i % nm
    m = models[j]
    x, y, t = batch(i)
    if infer:
      with fg.no_grad():
        if i % 2 == 0: m.eval()
        out = m(fg.tensor(x))
        obs.add(f"infer{i}", out.numpy())
        obs.add(f"infer_argmax{i}", out.argmax(-1).sum().item())
        m.train()
      continue
    opt, sched = opts[j]
    if i == mid:    # changes in the middle of the run
      if P["wd_change"]:
        for g in opt.param_groups: g["weight_decay"] = 0.03
      if P["data_swap"]:
        p0 = next(iter(m.parameters()))
        p0.data = p0.data * 0.5
      if P["freeze"]:
        for p in list(m.parameters())[:2]: p.requires_grad_(False)
    if P["zero_before"]: opt.zero_grad(set_to_none=P["set_to_none"])
    acc = P["accum"]
    b = x.shape[0]
    cuts = [(k * b // acc, (k + 1) * b // acc) for k in range(acc)]
    xt, yt, tt = fg.tensor(x), fg.tensor(y), fg.tensor(t)
    for lo, hi in cuts:
      if acc == 1: xs, ys, ts = xt, yt, tt
      elif P["micro_views"]: xs, ys, ts = xt[lo:hi], yt[lo:hi], tt[lo:hi]
      else: xs, ys, ts = fg.tensor(x[lo:hi]), fg.tensor(y[lo:hi]), fg.tensor(t[lo:hi])
      out = m(xs)
      loss = _loss(P, out, ys, ts)
      if acc > 1: loss = loss / acc
      if P["host_read"] and i % 2 == 1:      # a value read in the middle of the step, and a branch on it
        v = loss.item()
        obs.add(f"mid{i}", v)
        if v > prev[0]: loss = loss * 0.5
        prev[0] = v
      loss.backward()
    norm = None
    if P["clip"] == "norm": norm = fg.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    elif P["clip"] == "value": fg.nn.utils.clip_grad_value_(m.parameters(), 0.05)
    opt.step()
    if sched is not None: sched.step()
    if not P["zero_before"]: opt.zero_grad(set_to_none=P["set_to_none"])
    if P["ema"]:
      with fg.no_grad():
        for e, p in zip(emas[j], m.parameters()):
          if P["ema"] == "lerp": e.copy_(e.lerp(p.detach(), 0.1))   # (fusegrad has no lerp_)
          else: e.mul_(0.9).add_(p.detach(), alpha=0.1)
    if i % P["read_every"] == 0: obs.add(f"loss{i}", loss.item())
    if P["keep_act"]: obs.add(f"act{i}", out.numpy(), exact=False)
    if P["read_norm"]: obs.add(f"norm{i}", norm.numpy(), exact=False)
    if P["read_grad"]:
      g = list(m.parameters())[-1].grad
      obs.add(f"grad{i}", g.numpy() if g is not None else np.zeros(0, np.float32), exact=False)
    if P["eval_every"] and i % P["eval_every"] == P["eval_every"] - 1:
      m.eval()
      with fg.no_grad():
        o = m(fg.tensor(data[0][0]))
        obs.add(f"eval{i}", o.numpy())
      m.train()
  for j, m in enumerate(models):
    for k, v in m.state_dict().items(): obs.add(f"m{j}.{k}", v.numpy())
    if opts[j] is not None:
      opt = opts[j][0]
      for pi, st in enumerate(opt.state.values()):
        for k, v in sorted(st.items()):
          if k.startswith("_"): continue
          obs.add(f"m{j}.state{pi}.{k}", v.numpy() if isinstance(v, fg.Tensor) else np.float64(v))
    if emas[j]:
      for k, e in enumerate(emas[j]): obs.add(f"m{j}.ema{k}", e.numpy())
  return obs


def _expects_replays(P: dict) -> bool:
  """Does the program repeat steps a trace replays? Gradient accumulation over micro-batches replays for the MLP,
  but the residual, attention and conv models' accumulating steps deviate or are left unrecorded every time ("a write
  inside a call", "a backward reaching a leaf no call was given", "another call than the recorded one"): eager,
  correct, only slower; noted in the report of the fuzzer's first run rather than asserted here."""
  return P["steps"] >= 6 and (P["accum"] == 1 or P["model"] == "mlp")


def check_program(traced, P: dict, rng) -> dict:
  data = _data(P, rng)
  res, errs = [], []
  for flag in (False, True):
    traced(flag)
    before = dict(trace.stats)
    try:
      res.append(run_program(P, data))
      errs.append(None)
    except Exception as e:   # an exception must happen in both runs alike
      res.append(None)
      errs.append(e)
    d = {k: trace.stats[k] - before[k] for k in before}
  if errs[0] is not None or errs[1] is not None:
    if errs[1] is not None and errs[0] is None: raise errs[1]
    assert type(errs[0]) is type(errs[1]) and str(errs[0]) == str(errs[1]), (P, errs)
    raise errs[0]          # (the generator made a program eager refuses: its own defect)
  off, on = res
  assert [n for n, *_ in off.items] == [n for n, *_ in on.items], P
  for (name, a, exact), (_n, b, _e) in zip(off.items, on.items):
    if exact: np.testing.assert_array_equal(a, b, err_msg=f"{name} differs; program {P}")
    else: np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"{name} differs; program {P}")
  return d


@pytest.mark.parametrize("seed", range(FAST))
def test_random_program(traced, rng, seed):
  P = generate(seed, _EXCLUDED)
  d = check_program(traced, P, rng)
  if _expects_replays(P): assert d["replays"] >= 1, (P, d, list(trace.why))


if MORE:
  @pytest.mark.slow
  @pytest.mark.parametrize("seed", range(FAST, FAST + MORE))
  def test_random_program_more(traced, rng, seed):
    """More programs, when asked for: FUSEGRAD_TRACE_FUZZ=400 (about 8 minutes on 2 cores)."""
    P = generate(seed, _EXCLUDED)
    d = check_program(traced, P, rng)
    if _expects_replays(P): assert d["replays"] >= 1, (P, d, list(trace.why))


# ---- failures the fuzzer found, minimized (remove the xfail mark once fixed) -----------------------------------------

def _mlp(opt_cls, drop: float = 0.0, **kw):
  def make():
    m = nn.Sequential(nn.Linear(D_IN, HID), nn.ReLU(), *([nn.Dropout(drop)] if drop else []), nn.Linear(HID, NCLS))
    return m, opt_cls(m.parameters(), **kw)
  return make


def test_fuzz_deviation_after_a_replayed_dropout(traced, rng):
  """A replayed random draw made again when the replay deviates is handed its keys (once a TypeError)."""
  x = rng.standard_normal((8, D_IN), dtype=np.float32)
  def body(m, opt, i):
    h = m(fg.tensor(x))
    if i == 4: h = h * 2           # another call than the recorded one: the replay deviates after dropout's draw
    loss = h.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return [np.float32(loss.item())]
  off, on, d = _both(traced, _mlp(fg.optim.SGD, drop=0.2, lr=0.05), 6, body)
  _same(off, on)


def test_fuzz_zero_grad_keeping_zeros_with_momentum(traced, rng):
  """zero_grad(set_to_none=False) with SGD momentum: bitwise eager's (once an ulp off: a result made after a replayed
  step was made a target of the next recording, whose schedule was then not eager's)."""
  x = rng.standard_normal((8, D_IN), dtype=np.float32)
  y = rng.integers(0, NCLS, 8)
  def body(m, opt, i):
    opt.zero_grad(set_to_none=False)
    loss = F.cross_entropy(m(fg.tensor(x)), fg.tensor(y))
    loss.backward()
    opt.step()
    return [np.float32(loss.item())]
  off, on, d = _both(traced, _mlp(fg.optim.SGD, lr=0.05, momentum=0.9), 8, body)
  _same(off, on)


# (strict with gcc only: compiled by clang 14 the eager and the replayed kernels round alike, and the test passes)
@pytest.mark.xfail(strict=not is_clang(), reason="the loss read between the forward and the backward (`if loss.item() > x`): "
                   "the parameters differ from eager's by an ulp (eager's realize of the loss leaves the activations it "
                   "stored realized for the step; the replay's loss, made again for the backward, rebuilds them lazy)")
def test_fuzz_loss_read_before_backward(traced, rng):
  x = rng.standard_normal((8, D_IN), dtype=np.float32)
  y = rng.integers(0, NCLS, 8)
  def body(m, opt, i):
    loss = F.cross_entropy(m(fg.tensor(x)), fg.tensor(y))
    v = np.float32(loss.item())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return [v]
  off, on, d = _both(traced, _mlp(fg.optim.SGD, lr=0.05), 6, body)
  _same(off, on)


def test_fuzz_clip_norm_read_with_weight_decay(traced, rng):
  """A clipped gradient norm read after each step with L2 weight decay: bitwise eager's parameters (once an ulp off,
  for the same reason as above)."""
  x = rng.standard_normal((8, D_IN), dtype=np.float32)
  y = rng.integers(0, NCLS, 8)
  def body(m, opt, i):
    loss = F.cross_entropy(m(fg.tensor(x)), fg.tensor(y))
    opt.zero_grad()
    loss.backward()
    norm = fg.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
    opt.step()
    norm.numpy()                   # (read after the step: computed again, compared with a tolerance elsewhere)
    return [np.float32(loss.item())]
  off, on, d = _both(traced, _mlp(fg.optim.SGD, lr=0.05, weight_decay=0.02), 8, body)
  _same(off, on)
