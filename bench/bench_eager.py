"""Eager training steps of small models: fusegrad eager vs fusegrad.jit vs PyTorch eager, in one process.

Issue 10: a small model's eager step is dominated by Python (building the graph, scheduling, launching), not by
its kernels. The same step code runs for every contender (the libraries share the API): a nanoGPT (the faithful
copy in tests/nanogpt_model.py, 2 layers, d 32), a minGPT of the same size (tests/mingpt_model.py), a VAE
784-400-20 (the PyTorch example's model and loss), an MLP, the PyTorch example's MNIST convnet (batch 8, Adadelta;
its dropouts draw new masks every step), torchvision's ResNet-18 (8x3x32x32) and the PyTorch example's word-level
LSTM language model (its training loop: the hidden state carried, gradients clipped, parameters updated by hand).
"fusegrad eager" is the plain Python step, as a user writes it (a step that repeats is replayed from a checked
trace, engine/trace.py; otherwise its graphs' schedules are reused by structure and replayed, engine/realize.py);
"eager, no trace" turns the traces off; "eager, no replay" turns both off (`realize.no_replay()`,
FUSEGRAD_EAGER_REPLAY=0) to show what it buys; "fusegrad.jit" captures the step explicitly.

Times are per step (forward, loss, backward, optimizer step, reading the loss as a float): each contender runs
`--steps` steps per round, the contenders alternate for `--rounds` rounds, and each keeps its best round (the
VM's speed drifts; interleaving compares them at the same moments). Ratios above 1 mean fusegrad is faster.

    python bench/bench_eager.py [--steps 30] [--rounds 5] [--only gpt|mingpt|vae|mlp|mnist|resnet|wordlm] [--gc-freeze] [--profile gpt]
"""
from __future__ import annotations
import argparse
import contextlib
import datetime
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--steps", type=int, default=30, help="steps per round per contender")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--only", default=None,
                help="run the case of this key (gpt, mingpt, vae, mlp, mnist, resnet, wordlm), or those whose key contains it")
ap.add_argument("--gc-freeze", action="store_true",
                help="gc.freeze() after the warm-up (the long-lived objects of torch, numpy and the models leave the "
                     "collector's full passes; a diagnostic of what Python's garbage collector costs each library)")
ap.add_argument("--profile", default=None, help="cProfile fusegrad's eager step of this case instead of timing")
ARGS = ap.parse_args() if __name__ == "__main__" else ap.parse_args([])

import numpy as np  # noqa: E402
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import fusegrad as fg  # noqa: E402
from machine import describe  # noqa: E402
import torch  # noqa: E402
from nanogpt_model import GPTConfig, build  # noqa: E402
from fusegrad.engine import realize as fg_realize  # noqa: E402
NO_REPLAY = getattr(fg_realize, "no_replay", contextlib.nullcontext)   # (a fusegrad before the replay: the same path)


@contextlib.contextmanager
def NO_TRACE():
  """Eager steps without checked traces (engine/trace.py): graphs built, schedules replayed."""
  try:
    from fusegrad.engine import trace
  except ImportError:   # (a fusegrad before the traces: the same path)
    yield
    return
  old, trace.ENABLED = trace.ENABLED, False
  try:
    yield
  finally:
    trace.ENABLED = old


def load(ours, theirs) -> None:
  """Give the fusegrad model the torch model's weights."""
  ours.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})


def make_step(lib, model, opt, loss_fn, batches):
  """One training step, written once for both libraries."""
  def update(*xs):
    loss = loss_fn(model, *xs)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
  return update


def contenders(build_case, rng):
  """(torch step, fusegrad step factory): every fusegrad contender gets its own copy of the same weights."""
  th_model, th_opt, th_loss, batches, fg_model_opt, fg_loss = build_case(rng)
  th_batches = [tuple(torch.tensor(a) for a in b) for b in batches]
  fg_batches = [tuple(fg.tensor(a) for a in b) for b in batches]
  th_update = make_step(torch, th_model, th_opt, th_loss, th_batches)
  steps = {"torch": lambda i: th_update(*th_batches[i % len(th_batches)]).item()}
  for name in ("eager", "notrace", "noreplay", "jit"):
    m, o = fg_model_opt()
    load(m, th_model)
    upd = make_step(fg, m, o, fg_loss, fg_batches)
    if name == "jit": upd = fg.jit(upd)
    if name == "noreplay":
      def step(i, upd=upd):
        with NO_REPLAY(): return upd(*fg_batches[i % len(fg_batches)]).item()
    elif name == "notrace":
      def step(i, upd=upd):
        with NO_TRACE(): return upd(*fg_batches[i % len(fg_batches)]).item()
    else:
      def step(i, upd=upd): return upd(*fg_batches[i % len(fg_batches)]).item()
    steps[name] = step
  return steps


# ---- the cases -----------------------------------------------------------------------------------------------

def gpt_case(rng):
  cfg = dict(block_size=32, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
  B, T = 8, 32
  torch.manual_seed(0)
  th_model = build(torch)(GPTConfig(**cfg))
  th_opt = th_model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
  batches = [(rng.integers(0, 65, (B, T)), rng.integers(0, 65, (B, T))) for _ in range(4)]
  def fg_model_opt():
    m = build(fg)(GPTConfig(**cfg))
    return m, m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
  loss = lambda model, x, y: model(x, y)[1]
  return th_model, th_opt, loss, batches, fg_model_opt, loss


def mingpt_case(rng):
  from mingpt_model import MinGPTConfig, build as build_mingpt
  cfg = MinGPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32)
  B, T = 8, 32
  torch.manual_seed(0)
  th_model = build_mingpt(torch)(cfg)
  th_opt = th_model.configure_optimizers(0.1, 5e-4, (0.9, 0.95))
  batches = [(rng.integers(0, 65, (B, T)), rng.integers(0, 65, (B, T))) for _ in range(4)]
  def fg_model_opt():
    m = build_mingpt(fg)(cfg)
    return m, m.configure_optimizers(0.1, 5e-4, (0.9, 0.95))
  loss = lambda model, x, y: model(x, y)[1]
  return th_model, th_opt, loss, batches, fg_model_opt, loss


def vae_loss(lib):
  F = lib.nn.functional
  def loss(model, x):
    recon, mu, logvar = model(x)
    bce = F.binary_cross_entropy(recon, x.view(-1, 784), reduction="sum")
    return bce - 0.5 * lib.sum(1 + logvar - mu.pow(2) - logvar.exp())
  return loss


def vae_class(lib):
  nn, F = lib.nn, lib.nn.functional
  class VAE(nn.Module):   # pytorch/examples vae/main.py
    def __init__(self):
      super().__init__()
      self.fc1 = nn.Linear(784, 400)
      self.fc21 = nn.Linear(400, 20)
      self.fc22 = nn.Linear(400, 20)
      self.fc3 = nn.Linear(20, 400)
      self.fc4 = nn.Linear(400, 784)
    def encode(self, x):
      h1 = F.relu(self.fc1(x))
      return self.fc21(h1), self.fc22(h1)
    def reparameterize(self, mu, logvar):
      std = lib.exp(0.5 * logvar)
      eps = lib.randn_like(std)
      return mu + eps * std
    def decode(self, z):
      h3 = F.relu(self.fc3(z))
      return lib.sigmoid(self.fc4(h3))
    def forward(self, x):
      mu, logvar = self.encode(x.view(-1, 784))
      z = self.reparameterize(mu, logvar)
      return self.decode(z), mu, logvar
  return VAE


def vae_case(rng):
  torch.manual_seed(0)
  th_model = vae_class(torch)()
  batches = [(rng.random((32, 784), dtype=np.float32),) for _ in range(4)]
  def fg_model_opt():
    m = vae_class(fg)()
    return m, fg.optim.Adam(m.parameters(), lr=1e-3)
  return th_model, torch.optim.Adam(th_model.parameters(), lr=1e-3), vae_loss(torch), batches, fg_model_opt, vae_loss(fg)


def ce_loss(lib):
  return lambda model, x, y: lib.nn.functional.cross_entropy(model(x), y)


def mlp_class(lib):
  nn = lib.nn
  return lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def mlp_case(rng):
  torch.manual_seed(0)
  th_model = mlp_class(torch)()
  batches = [(rng.standard_normal((32, 64), dtype=np.float32), rng.integers(0, 10, 32)) for _ in range(4)]
  def fg_model_opt():
    m = mlp_class(fg)()
    return m, fg.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
  return (th_model, torch.optim.SGD(th_model.parameters(), lr=0.01, momentum=0.9), ce_loss(torch), batches,
          fg_model_opt, ce_loss(fg))


def mnist_class(lib):
  nn, F = lib.nn, lib.nn.functional
  class Net(nn.Module):   # pytorch/examples mnist/main.py
    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(1, 32, 3, 1)
      self.conv2 = nn.Conv2d(32, 64, 3, 1)
      self.dropout1 = nn.Dropout(0.25)
      self.dropout2 = nn.Dropout(0.5)
      self.fc1 = nn.Linear(9216, 128)
      self.fc2 = nn.Linear(128, 10)
    def forward(self, x):
      x = F.relu(self.conv1(x))
      x = F.relu(self.conv2(x))
      x = F.max_pool2d(x, 2)
      x = self.dropout1(x)
      x = lib.flatten(x, 1)
      x = F.relu(self.fc1(x))
      x = self.dropout2(x)
      return F.log_softmax(self.fc2(x), dim=1)
  return Net


def mnist_case(rng):
  torch.manual_seed(0)
  th_model = mnist_class(torch)()
  batches = [(rng.standard_normal((8, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 8)) for _ in range(4)]
  def fg_model_opt():
    m = mnist_class(fg)()
    return m, fg.optim.Adadelta(m.parameters(), lr=1.0)
  nll = lambda lib: (lambda model, x, y: lib.nn.functional.nll_loss(model(x), y))
  return (th_model, torch.optim.Adadelta(th_model.parameters(), lr=1.0), nll(torch), batches, fg_model_opt, nll(fg))


def resnet_class(lib):
  nn = lib.nn
  def conv3x3(cin, cout, stride=1): return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
  class BasicBlock(nn.Module):   # torchvision/models/resnet.py
    expansion = 1
    def __init__(self, inplanes, planes, stride=1, downsample=None):
      super().__init__()
      self.conv1 = conv3x3(inplanes, planes, stride)
      self.bn1 = nn.BatchNorm2d(planes)
      self.relu = nn.ReLU(inplace=True)
      self.conv2 = conv3x3(planes, planes)
      self.bn2 = nn.BatchNorm2d(planes)
      self.downsample = downsample
      self.stride = stride
    def forward(self, x):
      identity = x
      out = self.relu(self.bn1(self.conv1(x)))
      out = self.bn2(self.conv2(out))
      if self.downsample is not None: identity = self.downsample(x)
      out += identity
      return self.relu(out)
  class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), num_classes=1000):
      super().__init__()
      self.inplanes = 64
      self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
      self.bn1 = nn.BatchNorm2d(64)
      self.relu = nn.ReLU(inplace=True)
      self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
      self.layer1 = self._make_layer(64, layers[0])
      self.layer2 = self._make_layer(128, layers[1], stride=2)
      self.layer3 = self._make_layer(256, layers[2], stride=2)
      self.layer4 = self._make_layer(512, layers[3], stride=2)
      self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
      self.fc = nn.Linear(512, num_classes)
    def _make_layer(self, planes, blocks, stride=1):
      downsample = None
      if stride != 1 or self.inplanes != planes:
        downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                                   nn.BatchNorm2d(planes))
      layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
      self.inplanes = planes
      layers += [BasicBlock(self.inplanes, planes) for _ in range(1, blocks)]
      return nn.Sequential(*layers)
    def forward(self, x):
      x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
      x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
      x = lib.flatten(self.avgpool(x), 1)
      return self.fc(x)
  return ResNet


def resnet_case(rng):
  torch.manual_seed(0)
  th_model = resnet_class(torch)()
  batches = [(rng.standard_normal((8, 3, 32, 32), dtype=np.float32), rng.integers(0, 1000, 8)) for _ in range(4)]
  def fg_model_opt():
    m = resnet_class(fg)()
    return m, fg.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
  return (th_model, torch.optim.SGD(th_model.parameters(), lr=0.01, momentum=0.9), ce_loss(torch), batches,
          fg_model_opt, ce_loss(fg))


def wordlm_class(lib):
  """pytorch/examples word_language_model's RNNModel (LSTM; its init, dropout between the layers and around them)."""
  nn, F = lib.nn, lib.nn.functional

  class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
      super().__init__()
      self.ntoken, self.nhid, self.nlayers = ntoken, nhid, nlayers
      self.drop = nn.Dropout(dropout)
      self.encoder = nn.Embedding(ntoken, ninp)
      self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
      self.decoder = nn.Linear(nhid, ntoken)
      nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
      nn.init.zeros_(self.decoder.bias)
      nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input, hidden):
      emb = self.drop(self.encoder(input))
      output, hidden = self.rnn(emb, hidden)
      decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
      return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
      weight = next(self.parameters())
      return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
  return RNNModel


WORDLM = dict(ntoken=2000, ninp=200, nhid=200, nlayers=2, dropout=0.2)   # the example's sizes, a smaller vocabulary
WORDLM_BPTT, WORDLM_BATCH, WORDLM_LR, WORDLM_CLIP = 35, 20, 20.0, 0.25


def wordlm_steps(rng) -> dict:
  """The example's train() loop body: the hidden state carried to the next batch detached, clip_grad_norm_, the
  parameters updated by hand through `.data`, the loss read. Its own contenders (the state goes with the step);
  fusegrad.jit's step takes and returns the state."""
  torch.manual_seed(0)
  th_model = wordlm_class(torch)(**WORDLM)
  batches = [(rng.integers(0, WORDLM["ntoken"], (WORDLM_BPTT, WORDLM_BATCH)),
              rng.integers(0, WORDLM["ntoken"], WORDLM_BPTT * WORDLM_BATCH)) for _ in range(4)]

  def body(lib, model, x, y, hidden):
    hidden = tuple(h.detach() for h in hidden)
    model.zero_grad()
    output, hidden = model(x, hidden)
    loss = lib.nn.functional.nll_loss(output, y)
    loss.backward()
    lib.nn.utils.clip_grad_norm_(model.parameters(), WORDLM_CLIP)
    for p in model.parameters(): p.data.add_(p.grad, alpha=-WORDLM_LR)
    return loss, hidden

  def stepper(lib, model, data, wrap=contextlib.nullcontext, jit=False):
    state = [model.init_hidden(WORDLM_BATCH)]
    if jit:
      f = lib.jit(lambda x, y, h, c: (lambda r: (r[0], *r[1]))(body(lib, model, x, y, (h, c))))
      def step(i):
        loss, h, c = f(*data[i % len(data)], *state[0])
        state[0] = (h, c)
        return loss.item()
      return step
    def step(i):
      with wrap():
        loss, state[0] = body(lib, model, *data[i % len(data)], state[0])
        return loss.item()
    return step

  th_batches = [tuple(torch.tensor(a) for a in b) for b in batches]
  fg_batches = [tuple(fg.tensor(a) for a in b) for b in batches]
  steps = {"torch": stepper(torch, th_model, th_batches)}
  for name, wrap in (("eager", contextlib.nullcontext), ("notrace", NO_TRACE), ("noreplay", NO_REPLAY), ("jit", None)):
    m = wordlm_class(fg)(**WORDLM)
    load(m, th_model)
    steps[name] = stepper(fg, m, fg_batches, wrap, jit=wrap is None)
  return steps
wordlm_steps.steps = True


CASES = {
  "gpt": ("nanoGPT L2 d32 H2 T32 V65, batch 8, AdamW", gpt_case),
  "mingpt": ("minGPT L2 d32 H2 T32 V65, batch 8, AdamW", mingpt_case),
  "vae": ("VAE 784-400-20, batch 32, Adam", vae_case),
  "mlp": ("MLP 64-128-128-10, batch 32, SGD momentum", mlp_case),
  "mnist": ("MNIST convnet (pytorch/examples), batch 8, Adadelta", mnist_case),
  "resnet": ("ResNet-18 (torchvision), 8x3x32x32, SGD momentum", resnet_case),
  "wordlm": ("word LM (pytorch/examples), LSTM 2x200, bptt 35, batch 20, V 2000, clipped SGD by hand", wordlm_steps),
}


def steps_of(case, rng) -> dict:
  return case(rng) if getattr(case, "steps", False) else contenders(case, rng)


def measure(steps: dict, n: int, rounds: int) -> tuple[dict, dict]:
  """Seconds per step of each contender: the best of `rounds` interleaved rounds of n steps; and the last losses."""
  for i in range(4):   # warm-up: compiles, fills caches, captures
    for step in steps.values(): step(i)
  if ARGS.gc_freeze:
    import gc
    gc.collect()
    gc.freeze()
  best = {k: float("inf") for k in steps}
  loss, done = {}, 4
  order = list(steps)
  for r in range(rounds):
    # each round starts with another contender (bench_train.measure: the one after torch's round paid for it)
    for k in order[r % len(order):] + order[:r % len(order)]:
      step = steps[k]
      t0 = time.perf_counter()
      for i in range(n): loss[k] = step(done + i)
      best[k] = min(best[k], (time.perf_counter() - t0) / n)
    done += n
  return best, loss


def main() -> None:
  rng = np.random.default_rng(0)
  fg.manual_seed(0)
  if ARGS.profile:
    import cProfile
    import pstats
    steps = steps_of(CASES[ARGS.profile][1], rng)
    for i in range(5): steps["eager"](i)
    pr = cProfile.Profile()
    pr.enable()
    for i in range(20): steps["eager"](i)
    pr.disable()
    pstats.Stats(pr).sort_stats(os.environ.get("SORT","tottime")).print_stats(int(os.environ.get("NPR","30")))
    return
  commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
  print(f"# bench_eager: {describe()}, torch {torch.__version__} ({torch.get_num_threads()} threads), fusegrad {commit}, "
        f"{ARGS.rounds} rounds x {ARGS.steps} steps{', gc.freeze()' if ARGS.gc_freeze else ''}, {datetime.datetime.now():%Y-%m-%d %H:%M}")
  print("| case | torch ms | fusegrad eager ms | eager, no trace ms | eager, no replay ms | fusegrad.jit ms | "
        "eager vs torch | no trace vs torch | jit vs torch | eager / jit time | loss torch / eager / jit |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
  for key, (name, case) in CASES.items():
    if ARGS.only and not (key == ARGS.only if ARGS.only in CASES else ARGS.only in key): continue
    t, loss = measure(steps_of(case, rng), ARGS.steps, ARGS.rounds)
    ms = {k: v * 1e3 for k, v in t.items()}
    print(f"| {name} | {ms['torch']:.2f} | {ms['eager']:.2f} | {ms['notrace']:.2f} | {ms['noreplay']:.2f} | "
          f"{ms['jit']:.2f} | {t['torch'] / t['eager']:.2f}x | {t['torch'] / t['notrace']:.2f}x | {t['torch'] / t['jit']:.2f}x | "
          f"{t['eager'] / t['jit']:.2f} | {loss['torch']:.4f} / {loss['eager']:.4f} / {loss['jit']:.4f} |", flush=True)


if __name__ == "__main__":
  main()
