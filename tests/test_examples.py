"""The examples, shortened: each trains, checkpoints, reloads, and its loss falls."""
import os
import sys
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import digits  # noqa: E402
import charlm  # noqa: E402


def test_digits_mlp_learns(tmp_path):
  r = digits.train("mlp", epochs=4, progress=False, checkpoint=str(tmp_path / "mlp.safetensors"))
  assert r["losses"][-1] < 0.5 * r["losses"][0], r["losses"]
  assert r["test_accuracy"] > 0.85, r["test_accuracy"]
  assert r["reloaded_accuracy"] == r["test_accuracy"]      # the checkpoint holds the trained weights
  assert os.path.getsize(tmp_path / "mlp.safetensors") > 4 * (64 * 128 + 128 * 128)


def test_digits_cnn_learns(tmp_path):
  r = digits.train("cnn", epochs=2, progress=False, checkpoint=str(tmp_path / "cnn.safetensors"))
  assert r["losses"][-1] < 0.7 * r["losses"][0], r["losses"]
  assert r["test_accuracy"] > 0.5, r["test_accuracy"]
  assert r["reloaded_accuracy"] == r["test_accuracy"]      # BatchNorm running stats travel in the checkpoint too


def test_charlm_learns(tmp_path):
  r = charlm.train(steps=40, dim=64, heads=2, layers=1, batch=16, ctx=32, lr=3e-3, warmup=5, max_chars=200_000,
                   progress=False, eval_batches=4, sample_chars=20, checkpoint=str(tmp_path / "lm.safetensors"))
  assert np.mean(r["losses"][-5:]) < r["losses"][0] - 0.8, r["losses"]
  assert r["val"] < r["first_val"] - 0.8
  assert abs(r["val_reloaded"] - r["val"]) < 1e-5
  assert r["sample"].startswith("def ") and len(r["sample"]) == 24


def test_charlm_text_encoding_round_trips():
  s = "def f(x):\n  return x + 1  # ok\n"
  assert charlm.decode(charlm.encode(s)) == s
  assert charlm.decode(charlm.encode("caf\u00e9")) == "caf?"
