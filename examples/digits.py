"""Train a classifier on scikit-learn's 8x8 handwritten digits (shipped inside fusegrad, no download).

    python examples/digits.py                 # the MLP (what `make demo` runs): about 7 s on 2 cores
    python examples/digits.py --model cnn     # a small CNN
    python examples/digits.py --device OPENCL --epochs 40

A fixed 80/20 split (fusegrad.data.load_digits) is used: train on 1438 images, report accuracy on the
359 held-out ones. A progress bar shows the loss and throughput; at the end the weights are saved as a
safetensors checkpoint, loaded into a fresh model, and the reloaded model is evaluated again.
"""
from __future__ import annotations
import argparse
import os
import sys
import tempfile
import time
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fusegrad as fg  # noqa: E402
import fusegrad.nn as nn  # noqa: E402
import fusegrad.nn.functional as F  # noqa: E402
from fusegrad.data import DataLoader, load_digits  # noqa: E402
from fusegrad.nn import state  # noqa: E402


def make_model(kind: str) -> nn.Module:
  if kind == "mlp":
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))
  if kind == "cnn":
    return nn.Sequential(nn.Unflatten(1, (1, 8)),                                            # [N, 1, 8, 8]
                         nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.MaxPool2d(2),                                                     # [N, 32, 4, 4]
                         nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),  # [N, 32, 1, 1]
                         nn.Flatten(), nn.Linear(32, 10))
  raise ValueError(f"unknown model {kind!r} (mlp or cnn)")


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, device: str) -> float:
  model.eval()
  with fg.no_grad():
    pred = model(fg.tensor(x, device=device)).argmax(-1).numpy()
  model.train()
  return float((pred == y).mean())


def train(kind: str = "mlp", epochs: int | None = None, batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
          device: str | None = None, progress: bool = True, checkpoint: str | None = None) -> dict:
  """Train, checkpoint, reload; returns the metrics (the tests call this with few epochs)."""
  from tqdm import tqdm
  device = device or fg.config.DEVICE
  fg.manual_seed(seed)
  epochs = epochs or (30 if kind == "mlp" else 20)
  xtr, ytr = load_digits("train")
  xte, yte = load_digits("test")
  xtr, xte = xtr / np.float32(16), xte / np.float32(16)        # pixel counts 0..16 -> [0, 1]
  model = make_model(kind).to(device)
  opt = fg.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
  loader = DataLoader((xtr, ytr), batch_size=batch_size, shuffle=True, seed=seed, device=device)
  sched = fg.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * len(loader))
  losses = []
  bar = tqdm(total=epochs * len(loader), desc=f"digits {kind}", unit="step", disable=not progress, mininterval=0.25)
  t0 = time.perf_counter()
  seen = 0

  @fg.jit   # the second call is captured; later calls replay its kernels (the short last batch gets its own)
  def step(x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss

  for epoch in range(epochs):
    total, count = 0.0, 0
    for x, y in loader:
      loss = step(x, y)
      sched.step()
      total += loss.item() * len(y)
      count += len(y)
      seen += len(y)
      bar.update(1)
      bar.set_postfix(epoch=epoch + 1, loss=f"{total / count:.4f}", img_s=f"{seen / (time.perf_counter() - t0):.0f}")
    losses.append(total / count)
  bar.close()
  train_s = time.perf_counter() - t0
  acc = accuracy(model, xte, yte, device)

  # save, load into a fresh model, evaluate again
  path = checkpoint or os.path.join(tempfile.mkdtemp(prefix="fusegrad-digits-"), f"digits-{kind}.safetensors")
  state.save_file(model.state_dict(), path)
  fresh = make_model(kind).to(device)
  fresh.load_state_dict(state.load_file(path, device=device))
  acc_reloaded = accuracy(fresh, xte, yte, device)
  return dict(losses=losses, test_accuracy=acc, reloaded_accuracy=acc_reloaded, checkpoint=path, train_seconds=train_s,
              epochs=epochs)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
  ap.add_argument("--epochs", type=int, default=None, help="default: 30 (mlp) or 20 (cnn)")
  ap.add_argument("--batch-size", type=int, default=64)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--device", default=None, help="CPU (default), OPENCL or PYTHON")
  ap.add_argument("--checkpoint", default=None, help="where to save the weights (default: a temporary directory)")
  args = ap.parse_args()
  r = train(args.model, args.epochs, args.batch_size, args.lr, args.seed, args.device, checkpoint=args.checkpoint)
  print(f"digits {args.model}: {r['epochs']} epochs in {r['train_seconds']:.1f} s, final train loss "
        f"{r['losses'][-1]:.4f}")
  print(f"checkpoint: {r['checkpoint']} (reloaded model: test accuracy {r['reloaded_accuracy']:.2%})")
  print(f"test accuracy: {r['test_accuracy']:.2%} on 359 held-out images")


if __name__ == "__main__":
  main()
