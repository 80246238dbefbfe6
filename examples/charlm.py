"""A character-level transformer language model trained on the Python standard library's own source.

    python examples/charlm.py                  # about 5 minutes on 2 CPU cores
    python examples/charlm.py --steps 3000 --dim 192 --layers 4
    python examples/charlm.py --device OPENCL

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP -> residual),
learned position embeddings, AdamW with a linear warmup then a cosine schedule. The text is the
stdlib's .py files (every Python install has them), read as characters; the last 10% is held out.
The script reports the validation loss against the unigram entropy of the text (the loss of a model
that knows only character frequencies), saves a checkpoint, reloads it and samples from it.
"""
from __future__ import annotations
import argparse
import math
import os
import sys
import tempfile
import time
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fusegrad as fg  # noqa: E402
import fusegrad.nn as nn  # noqa: E402
import fusegrad.nn.functional as F  # noqa: E402
from fusegrad.nn import state  # noqa: E402

# the vocabulary: newline, printable ASCII; anything else reads as '?'
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB = len(CHARS)


def encode(text: str) -> np.ndarray:
  table = np.full(256, CHARS.index("?"), np.int64)
  for i, c in enumerate(CHARS): table[ord(c)] = i
  raw = np.frombuffer(text.encode("ascii", "replace"), np.uint8)
  return table[raw]


def decode(ids) -> str: return "".join(CHARS[int(i)] for i in ids)


def stdlib_text(max_chars: int = 4_000_000) -> str:
  """The standard library's top-level .py files in name order, up to max_chars characters."""
  root = os.path.dirname(os.__file__)
  parts, total = [], 0
  for name in sorted(os.listdir(root)):
    if not name.endswith(".py"): continue
    with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f: s = f.read()
    parts.append(s)
    total += len(s)
    if total >= max_chars: break
  return "".join(parts)[:max_chars]


class Block(nn.Module):
  def __init__(self, dim: int, heads: int):
    super().__init__()
    self.heads = heads
    self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
    self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
    self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

  def forward(self, x):
    B, T, C = x.shape
    q, k, v = self.qkv(self.ln1(x)).reshape(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)           # [B, H, T, D]
    x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
    return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharTransformer(nn.Module):
  def __init__(self, vocab: int = VOCAB, ctx: int = 64, dim: int = 128, heads: int = 4, layers: int = 2):
    super().__init__()
    self.ctx = ctx
    self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
    self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
    self.ln = nn.LayerNorm(dim)
    self.head = nn.Linear(dim, vocab)

  def forward(self, idx):
    T = idx.shape[1]
    x = self.tok(idx) + self.pos(fg.arange(T, device=idx.device))
    for b in self.blocks: x = b(x)
    return self.head(self.ln(x))


def TorchCharTransformer(vocab: int = VOCAB, ctx: int = 64, dim: int = 128, heads: int = 4, layers: int = 2):
  """The same model in PyTorch, with the same parameter names (bench/bench_train.py compares the two)."""
  import torch
  tnn = torch.nn

  class TBlock(tnn.Module):
    def __init__(self):
      super().__init__()
      self.ln1, self.ln2 = tnn.LayerNorm(dim), tnn.LayerNorm(dim)
      self.qkv, self.proj = tnn.Linear(dim, 3 * dim), tnn.Linear(dim, dim)
      self.fc, self.out = tnn.Linear(dim, 4 * dim), tnn.Linear(4 * dim, dim)

    def forward(self, x):
      B, T, C = x.shape
      q, k, v = self.qkv(self.ln1(x)).reshape(B, T, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
      a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
      x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
      return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))

  class TModel(tnn.Module):
    def __init__(self):
      super().__init__()
      self.tok, self.pos = tnn.Embedding(vocab, dim), tnn.Embedding(ctx, dim)
      self.blocks = tnn.ModuleList([TBlock() for _ in range(layers)])
      self.ln = tnn.LayerNorm(dim)
      self.head = tnn.Linear(dim, vocab)

    def forward(self, idx):
      x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
      for b in self.blocks: x = b(x)
      return self.head(self.ln(x))
  return TModel()


def unigram_entropy(ids: np.ndarray) -> float:
  p = np.bincount(ids, minlength=VOCAB) / len(ids)
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


def evaluate(model, data: np.ndarray, ctx: int, batch: int, batches: int, device: str) -> float:
  """Mean loss over fixed, evenly spaced windows of data."""
  starts = np.linspace(0, len(data) - ctx - 2, batches * batch).astype(np.int64).reshape(batches, batch)
  model.eval()
  total = 0.0
  with fg.no_grad():
    for s in starts:
      w = np.stack([data[i:i + ctx + 1] for i in s])
      x, y = fg.tensor(w[:, :-1], device=device), fg.tensor(w[:, 1:], device=device)
      total += F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).item()
  model.train()
  return total / batches


def sample(model, prompt: str, n: int, ctx: int, device: str, temperature: float = 0.8, seed: int = 0) -> str:
  """Autoregressive sampling. The model always sees a [1, ctx] window (right-padded; causal attention
  keeps padding out of view), so every step reuses the same compiled kernels."""
  rng = np.random.default_rng(seed)
  ids = list(encode(prompt))
  model.eval()
  with fg.no_grad():
    for _ in range(n):
      window = ids[-ctx:]
      x = np.zeros((1, ctx), np.int64)
      x[0, :len(window)] = window
      logits = model(fg.tensor(x, device=device))[0, len(window) - 1].numpy().astype(np.float64) / temperature
      p = np.exp(logits - logits.max())
      ids.append(int(rng.choice(VOCAB, p=p / p.sum())))
  model.train()
  return decode(ids)


def train(steps: int = 1500, ctx: int = 64, dim: int = 128, heads: int = 4, layers: int = 2, batch: int = 32,
          lr: float = 2e-3, warmup: int = 100, seed: int = 0, device: str | None = None, max_chars: int = 4_000_000,
          progress: bool = True, eval_batches: int = 20, sample_chars: int = 300, checkpoint: str | None = None) -> dict:
  from tqdm import tqdm
  device = device or fg.config.DEVICE
  fg.manual_seed(seed)
  data = encode(stdlib_text(max_chars))
  split = int(0.9 * len(data))
  train_ids, val_ids = data[:split], data[split:]
  h_unigram = unigram_entropy(train_ids)
  model = CharTransformer(VOCAB, ctx, dim, heads, layers).to(device)
  decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
  no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
  opt = fg.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=lr,
                       betas=(0.9, 0.95))
  warm = fg.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=warmup)
  cos = fg.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps - warmup), eta_min=lr * 0.05)
  sched = fg.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[warmup])
  rng = np.random.default_rng(seed)
  first_val = evaluate(model, val_ids, ctx, batch, eval_batches, device)
  losses = []
  bar = tqdm(range(steps), desc="charlm", unit="step", disable=not progress, mininterval=0.25)
  t0 = time.perf_counter()
  for step in bar:
    starts = rng.integers(0, len(train_ids) - ctx - 1, batch)
    w = np.stack([train_ids[i:i + ctx + 1] for i in starts])
    x, y = fg.tensor(w[:, :-1], device=device), fg.tensor(w[:, 1:], device=device)
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    fg.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    losses.append(loss.item())
    if step % 10 == 0 or step == steps - 1:
      bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}",
                      tok_s=f"{(step + 1) * batch * ctx / (time.perf_counter() - t0):.0f}")
  bar.close()
  train_s = time.perf_counter() - t0
  val = evaluate(model, val_ids, ctx, batch, eval_batches, device)

  path = checkpoint or os.path.join(tempfile.mkdtemp(prefix="fusegrad-charlm-"), "charlm.safetensors")
  state.save_file(model.state_dict(), path)
  fresh = CharTransformer(VOCAB, ctx, dim, heads, layers).to(device)
  fresh.load_state_dict(state.load_file(path, device=device))
  val_reloaded = evaluate(fresh, val_ids, ctx, batch, eval_batches, device)
  text = sample(fresh, "def ", sample_chars, ctx, device, seed=seed) if sample_chars else ""
  return dict(losses=losses, first_val=first_val, val=val, val_reloaded=val_reloaded, unigram=h_unigram,
              train_seconds=train_s, sample=text, checkpoint=path, steps=steps)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=1500)
  ap.add_argument("--ctx", type=int, default=64)
  ap.add_argument("--dim", type=int, default=128)
  ap.add_argument("--heads", type=int, default=4)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--lr", type=float, default=2e-3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--device", default=None)
  ap.add_argument("--checkpoint", default=None)
  a = ap.parse_args()
  r = train(a.steps, a.ctx, a.dim, a.heads, a.layers, a.batch, a.lr, seed=a.seed, device=a.device,
            checkpoint=a.checkpoint)
  print(f"charlm: {r['steps']} steps in {r['train_seconds']:.0f} s")
  print(f"checkpoint: {r['checkpoint']} (reloaded: validation loss {r['val_reloaded']:.3f})")
  print("sample:\n" + "-" * 60 + "\n" + r["sample"] + "\n" + "-" * 60)
  print(f"validation loss {r['val']:.3f} nats/char (before training {r['first_val']:.3f}; unigram entropy "
        f"{r['unigram']:.3f}; {math.exp(r['val']):.2f} perplexity)")


if __name__ == "__main__":
  main()
