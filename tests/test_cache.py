"""The on-disk program cache, across processes: a second run compiles nothing and agrees with the first; a
cache whose files were damaged in any way is rebuilt, never loaded, and the answers stay right.

Each run is a fresh interpreter (sys.executable -c ...) with FUSEGRAD_CACHE_DIR pointing at a temporary dir.
"""
from __future__ import annotations
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import numpy as np
import pytest
from conftest import DEVICES
from fusegrad import config
from fusegrad.runtime import cache, cpu
from fusegrad.runtime import device as rd
from fusegrad.runtime.device import CompileError, clip_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# several distinct kernels (elementwise, reduce, matmul, softmax, a view), fixed data, values out as JSON
CHILD = r"""
import json, sys
import numpy as np
import fusegrad as fg
from fusegrad.runtime import device as rd
dev = sys.argv[1]
x = fg.tensor(np.linspace(-2, 2, 48, dtype=np.float32).reshape(6, 8), device=dev)
w = fg.tensor(np.cos(np.arange(40, dtype=np.float32)).reshape(8, 5), device=dev)
outs = [((x + 1) * x).exp(), x.sum(1), (x @ w).relu(), x.softmax(-1), x.permute(1, 0)[::2] * 3, x.amax(0) - x.min(),
        x.flip(0).pad((1, 1)).tanh(), (x * 2).sum(0, keepdim=True) + x, x.argmax(1), x[2:5].abs().sqrt()]
print(json.dumps({"values": [o.numpy().astype(float).ravel().tolist() for o in outs],
                  "compiles": rd.get(dev).compiles}))
"""


def np_expected() -> list:
  x = np.linspace(-2, 2, 48, dtype=np.float32).reshape(6, 8).astype(np.float64)
  w = np.cos(np.arange(40, dtype=np.float32)).reshape(8, 5).astype(np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  outs = [np.exp((x + 1) * x), x.sum(1), np.maximum(x @ w, 0), e / e.sum(-1, keepdims=True), x.T[::2] * 3,
          x.max(0) - x.min(), np.tanh(np.pad(x[::-1], ((0, 0), (1, 1)))), (x * 2).sum(0, keepdims=True) + x,
          x.argmax(1), np.sqrt(np.abs(x[2:5]))]
  return [o.ravel() for o in outs]


CACHE_DEVICES = [d for d in DEVICES if d != "PYTHON"]


def run_child(cache_dir, device: str, **extra_env) -> dict:
  drop = ("FUSEGRAD_CACHE_DIR", "FUSEGRAD_NO_DISK_CACHE", "FUSEGRAD_DEBUG", "FUSEGRAD_DEVICE")
  env = {k: v for k, v in os.environ.items() if k not in drop}
  env.update(FUSEGRAD_CACHE_DIR=str(cache_dir), PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), **extra_env)
  r = subprocess.run([sys.executable, "-c", CHILD, device], capture_output=True, text=True, env=env, cwd=ROOT,
                     timeout=300)
  assert r.returncode == 0, f"child failed:\n{r.stdout}\n{r.stderr}"
  return json.loads(r.stdout.strip().splitlines()[-1])


def check_values(result: dict) -> None:
  for got, ref in zip(result["values"], np_expected(), strict=True):
    np.testing.assert_allclose(np.array(got), ref, rtol=2e-5, atol=1e-5)


def cache_files(cache_dir) -> list[str]:
  return sorted(os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs if f.endswith(".bin"))


def corrupt_all(files: list[str]) -> None:
  """Damage every entry: six kinds of damage in turn, and one entry renamed onto another key's name."""
  assert len(files) >= 8, files
  # rename: key A's (valid) entry now sits under key B's name, and A's own entry is gone
  os.replace(files[-2], files[-1])
  for i, path in enumerate(files[:-2]):
    with open(path, "rb") as f: data = f.read()
    header, _, payload = data.partition(b"\n")
    kind = i % 6
    if kind == 0: data = data[:len(data) // 2]                                   # truncated
    elif kind == 1: data = b""                                                   # empty
    elif kind == 2:                                                              # flipped bytes in the payload
      p = bytearray(payload)
      for j in range(0, len(p), max(1, len(p) // 16)): p[j] ^= 0xFF
      data = header + b"\n" + bytes(p)
    elif kind == 3:                                                              # header lies about the size
      data = header.replace(b'"size": ', b'"size": 1') + b"\n" + payload
    elif kind == 4: data = b"\x7fELF not a fusegrad cache entry\n" + os.urandom(300)   # foreign content
    else:                                                                        # flipped bytes in the header
      data = bytes(b ^ 0x20 for b in header[:20]) + header[20:] + b"\n" + payload
    assert data != header + b"\n" + payload
    with open(path, "wb") as f: f.write(data)


def forge_all(cache_dir, files: list[str]) -> None:
  """Replace every payload by garbage under a header that checks out: right key and size, and an HMAC made with
  this user's own secret key (as if fusegrad itself had stored a binary that does not load)."""
  with open(os.path.join(cache_dir, "secret.key"), "rb") as f: secret = f.read()
  for path in files:
    with open(path, "rb") as f: header = json.loads(f.readline())
    payload = b"\x7fELF" + os.urandom(4000)
    header.update(size=len(payload), hmac=cache.seal(secret, header["store"], header["key"], payload))
    with open(path, "wb") as f: f.write(json.dumps(header).encode() + b"\n" + payload)


@pytest.mark.parametrize("device", CACHE_DEVICES)
def test_disk_cache_across_processes(tmp_path, device):
  cache_dir = tmp_path / "cache"
  first = run_child(cache_dir, device)
  assert first["compiles"] > 0
  check_values(first)
  files = cache_files(cache_dir)
  assert len(files) >= 8, files      # one entry per distinct kernel

  second = run_child(cache_dir, device)
  assert second["compiles"] == 0, "the second process compiled although every kernel was cached"
  assert second["values"] == first["values"]
  assert cache_files(cache_dir) == files

  corrupt_all(files)
  third = run_child(cache_dir, device)
  assert third["compiles"] > 0
  assert third["compiles"] == first["compiles"], "every damaged entry must be rebuilt"
  check_values(third)
  assert third["values"] == first["values"]

  # the rebuilt entries are good again
  fourth = run_child(cache_dir, device)
  assert fourth["compiles"] == 0
  assert fourth["values"] == first["values"]


@pytest.mark.parametrize("device", [
  "CPU",
  *CACHE_DEVICES[1:]])
def test_well_formed_entry_with_bad_binary_is_rebuilt(tmp_path, device):
  # an entry can pass every header check and still hold a binary that does not load (written by another
  # build of the toolchain, a bad disk, a buggy writer): the device must fall back to compiling
  cache_dir = tmp_path / "cache"
  first = run_child(cache_dir, device)
  forge_all(cache_dir, cache_files(cache_dir))
  again = run_child(cache_dir, device)
  assert again["compiles"] == first["compiles"]
  assert again["values"] == first["values"]


def test_cpu_device_leaves_no_temporary_files(tmp_path):
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  check_values(run_child(tmp_path / "cache", "CPU", TMPDIR=str(tmp)))
  assert list(tmp.iterdir()) == []


# ---- trust: only what this user's fusegrad compiled for exactly this key is ever loaded ----

def child_env(cache_dir, **extra_env) -> dict:
  drop = ("FUSEGRAD_CACHE_DIR", "FUSEGRAD_NO_DISK_CACHE", "FUSEGRAD_DEBUG", "FUSEGRAD_DEVICE", "FUSEGRAD_CC")
  env = {k: v for k, v in os.environ.items() if k not in drop}
  env.update(FUSEGRAD_CACHE_DIR=str(cache_dir), PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), **extra_env)
  return env


def read_entry(path: str) -> tuple[dict, bytes]:
  with open(path, "rb") as f: header, _, payload = f.read().partition(b"\n")
  return json.loads(header), payload


def write_entry(path: str, header: dict, payload: bytes) -> None:
  with open(path, "wb") as f: f.write(json.dumps(header).encode() + b"\n" + payload)


PLANT = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen(MARKER, "w"); if (f) fclose(f); }
"""


def test_planted_shared_object_is_never_loaded(tmp_path):
  # a shared object's constructor runs at dlopen, before any check of what it holds: an entry that a
  # checksum accepts (the old format) or that names the right key without the right HMAC must not reach dlopen
  cache_dir = tmp_path / "cache"
  first = run_child(cache_dir, "CPU")
  marker = tmp_path / "planted-ran"
  so = tmp_path / "plant.so"
  cc, _ = cpu.find_compiler()
  subprocess.run([cc, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-x", "c", "-", "-o", str(so)], input=PLANT,
                 text=True, check=True, capture_output=True)
  # the planted object does what it says when loaded: the assertion below can fail
  subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(so)!r})"], check=True)
  assert marker.exists()
  marker.unlink()
  payload = so.read_bytes()
  files = cache_files(cache_dir)
  for i, path in enumerate(files):
    header, _ = read_entry(path)
    if i % 2:   # the previous format: a checksum anyone can compute
      forged = {"format": "fusegrad-cache-1", "key": header["key"], "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest()}
    else:       # the current format with a made-up HMAC
      forged = dict(header, size=len(payload), hmac=hashlib.sha256(payload).hexdigest())
    write_entry(path, forged, payload)
  again = run_child(cache_dir, "CPU")
  assert not marker.exists(), "a planted shared object was loaded from the cache"
  assert again["compiles"] == first["compiles"]
  check_values(again)


@pytest.mark.parametrize("device", CACHE_DEVICES)
def test_swapped_and_mutated_entries_are_rebuilt(tmp_path, device):
  cache_dir = tmp_path / "cache"
  first = run_child(cache_dir, device)
  files = cache_files(cache_dir)
  entries = [read_entry(p) for p in files]
  for i, path in enumerate(files):
    header, payload = entries[i]
    other_header, other_payload = entries[(i + 1) % len(files)]
    kind = i % 4
    if kind == 0:   # another key's whole entry copied over this one (a different kernel's binary)
      write_entry(path, other_header, other_payload)
    elif kind == 1:   # ... with this entry's key written into its header
      write_entry(path, dict(other_header, key=header["key"]), other_payload)
    elif kind == 2:   # one byte of the payload changed
      p = bytearray(payload)
      p[len(p) // 2] ^= 0x01
      write_entry(path, header, bytes(p))
    else:             # one digit of the HMAC changed
      mac = header["hmac"]
      write_entry(path, dict(header, hmac=mac[:-1] + ("0" if mac[-1] != "0" else "1")), payload)
  again = run_child(cache_dir, device)
  assert again["compiles"] == first["compiles"], "every swapped or mutated entry must be rebuilt"
  check_values(again)
  assert again["values"] == first["values"]


def test_world_writable_cache_dir_is_refused_across_processes(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o777)
  env = child_env(shared, XDG_CACHE_HOME=str(tmp_path / "xdg"))
  r = subprocess.run([sys.executable, "-c", CHILD, "CPU"], capture_output=True, text=True, env=env, cwd=ROOT,
                     timeout=300)
  assert r.returncode == 0, r.stderr
  check_values(json.loads(r.stdout.strip().splitlines()[-1]))
  assert f"not using the kernel cache directory {shared}: users other than its owner can write" in r.stderr, r.stderr
  assert list(shared.iterdir()) == [], "nothing may be written to a directory other users can write"
  assert len(cache_files(tmp_path / "xdg" / "fusegrad")) >= 8


NO_OUTPUT_CHILD = r"""
import numpy as np
import fusegrad as fg
from fusegrad.runtime.device import CompileError
try:
  (fg.tensor(np.ones(4, dtype=np.float32)) + 1).numpy()
except CompileError as e:
  print("CompileError:", e)
"""


def test_compiler_that_writes_nothing_is_a_compile_error(tmp_path):
  fake = tmp_path / "fakecc"
  fake.write_text("#!/bin/sh\necho 'fakecc version 1.0'\nexit 0\n")
  fake.chmod(0o755)
  r = subprocess.run([sys.executable, "-c", NO_OUTPUT_CHILD], capture_output=True, text=True, cwd=ROOT, timeout=120,
                     env=child_env(tmp_path / "cache", FUSEGRAD_CC=str(fake), FUSEGRAD_NO_DISK_CACHE="1"))
  assert r.returncode == 0, r.stderr
  assert "CompileError: the C compiler" in r.stdout and "exited with status 0 but wrote no shared library" in r.stdout


def test_long_compiler_stderr_is_truncated(tmp_path):
  noisy = tmp_path / "noisycc"
  noisy.write_text("#!/bin/sh\ni=0\nwhile [ $i -lt 5000 ]; do echo \"error line $i: something is wrong\" >&2; "
                   "i=$((i+1)); done\nexit 1\n")
  noisy.chmod(0o755)
  with pytest.raises(CompileError, match=r"(?s)error line 0:.*more characters \(\d+ more lines\) cut") as e:
    rd.get("CPU")._build(str(noisy), [], "int x;")
  msg = str(e.value)
  assert "error line 4999" not in msg and len(msg) < 6000


def test_clip_log():
  text = "\n".join(f"line {i}" for i in range(1000))
  out = clip_log(text)
  assert out.startswith("line 0\nline 1\n") and "line 40\n" not in out
  assert out.endswith(f"[... {len(text) - len(chr(10).join(text.splitlines()[:40]))} more characters (960 more lines) cut]")
  one = "x" * 100_000
  assert len(clip_log(one)) < 4200 and "95904 more characters (0 more lines) cut" in clip_log(one)
  assert clip_log("short\n") == "short"


MISSING_LD_CHILD = r"""
import numpy as np
import fusegrad as fg
try:
  print((fg.tensor(np.ones(4, dtype=np.float32), device="OPENCL") + 1).numpy())
except RuntimeError as e:
  print("RuntimeError:", e)
"""


@pytest.mark.skipif("OPENCL" not in DEVICES, reason="no OpenCL device on this machine")
def test_opencl_without_linker_raises_instead_of_aborting(tmp_path):
  empty = tmp_path / "bin"
  empty.mkdir()
  r = subprocess.run([sys.executable, "-c", MISSING_LD_CHILD], capture_output=True, text=True, cwd=ROOT, timeout=120,
                     env=child_env(tmp_path / "cache", PATH=str(empty), FUSEGRAD_NO_DISK_CACHE="1"))
  assert r.returncode == 0, f"the process died (status {r.returncode}) instead of raising:\n{r.stderr[-3000:]}"
  assert "RuntimeError: device OPENCL" in r.stdout and "no `ld` on PATH" in r.stdout, r.stdout


# ---- the store itself, in this process ----

@pytest.fixture
def store_dirs(tmp_path, monkeypatch):
  """A fresh cache root under tmp_path: (requested dir, default dir); the real one comes back afterwards."""
  req, default = tmp_path / "req", tmp_path / "default"
  monkeypatch.setattr(config, "CACHE_DIR", str(req))
  monkeypatch.setattr(config, "DEFAULT_CACHE_DIR", str(default))
  monkeypatch.setattr(config, "DISABLE_DISK_CACHE", 0)
  cache.reset()
  yield req, default
  cache.reset()


def all_files(d) -> list[str]:
  return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def test_store_round_trip_and_permissions(store_dirs):
  req, _ = store_dirs
  s = cache.Store("trial")
  assert s.get("k") is None
  s.put("k", b"payload \x00\xff")
  assert s.get("k") == b"payload \x00\xff"
  assert cache.root() == str(req)
  assert os.stat(req).st_mode & 0o777 == 0o700
  assert os.stat(req / "secret.key").st_mode & 0o777 == 0o600
  path = s.path("k")
  assert os.stat(path).st_mode & 0o777 == 0o600
  for d in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
    assert os.stat(d).st_mode & 0o777 == 0o700, d


def test_store_rejects_swaps_across_keys_and_stores(store_dirs):
  a, b = cache.Store("alpha"), cache.Store("beta")
  a.put("k1", b"one")
  a.put("k2", b"two")
  b.put("k1", b"uno")
  p1, p2, pb = a.path("k1"), a.path("k2"), b.path("k1")
  with open(p1, "rb") as f: e1 = f.read()
  header, _, payload = e1.partition(b"\n")
  with open(p2, "wb") as f: f.write(e1)                          # k1's entry under k2's name
  assert a.get("k2") is None
  forged = json.dumps(dict(json.loads(header), key="k2")).encode() + b"\n" + payload
  with open(p2, "wb") as f: f.write(forged)                      # ... with k2 written into the header
  assert a.get("k2") is None
  forged = json.dumps(dict(json.loads(header), store="beta")).encode() + b"\n" + payload
  with open(pb, "wb") as f: f.write(forged)                      # another store's entry for the same key
  assert b.get("k1") is None
  a.put("k2", b"two")
  assert (a.get("k1"), a.get("k2")) == (b"one", b"two")


def test_store_rejects_every_single_byte_change(store_dirs):
  s = cache.Store("trial")
  s.put("k", b"0123456789" * 5)
  path = s.path("k")
  with open(path, "rb") as f: good = f.read()
  for i in range(len(good)):
    bad = bytearray(good)
    bad[i] ^= 0x01
    with open(path, "wb") as f: f.write(bad)
    assert s.get("k") is None, f"byte {i} changed and the entry was still returned"
  header, _, payload = good.partition(b"\n")
  for mac in ("\u00e9" * 64, "\ud800", 12, None, ""):   # not even a hex string: a miss, not an exception
    with open(path, "wb") as f: f.write(json.dumps(dict(json.loads(header), hmac=mac)).encode() + b"\n" + payload)
    assert s.get("k") is None, mac
  for bad_header in (b"[" * 3000, b"{" * 5000, b"\xff\xfe", b"null", b"[]"):   # never an exception either
    with open(path, "wb") as f: f.write(bad_header + b"\n" + payload)
    assert s.get("k") is None, bad_header[:10]
  with open(path, "wb") as f: f.write(good)
  assert s.get("k") == b"0123456789" * 5


def get_within(store, key, seconds: float = 20.0):
  """store.get(key) on a daemon thread: a get that blocks fails the test instead of hanging it."""
  out = []
  t = threading.Thread(target=lambda: out.append(store.get(key)), daemon=True)
  t.start()
  t.join(seconds)
  assert not t.is_alive(), f"reading the cache entry for {key!r} blocked"
  return out[0]


def test_fifo_and_device_symlink_entries_are_misses_and_replaced(store_dirs):
  s = cache.Store("trial")
  s.put("fifo", b"x")
  s.put("zero", b"x")
  os.unlink(s.path("fifo"))
  os.mkfifo(s.path("fifo"))
  os.unlink(s.path("zero"))
  os.symlink("/dev/zero", s.path("zero"))
  assert get_within(s, "fifo") is None
  assert get_within(s, "zero") is None
  s.put("fifo", b"one")
  s.put("zero", b"two")
  assert (s.get("fifo"), s.get("zero")) == (b"one", b"two")
  assert os.path.isfile(s.path("zero")) and not os.path.islink(s.path("zero"))
  assert stat.S_ISCHR(os.stat("/dev/zero").st_mode)


def test_symlink_to_a_valid_entry_is_not_followed(store_dirs, tmp_path):
  s = cache.Store("trial")
  s.put("k", b"payload")
  elsewhere = tmp_path / "elsewhere.bin"
  os.replace(s.path("k"), elsewhere)
  os.symlink(elsewhere, s.path("k"))
  assert s.get("k") is None


def test_huge_entries_are_neither_read_nor_written(store_dirs, monkeypatch):
  s = cache.Store("trial")
  s.put("k", b"small")
  with open(s.path("k"), "r+b") as f: f.truncate(config.MAX_CACHE_ENTRY_BYTES + (1 << 20))   # sparse: no real disk
  assert get_within(s, "k") is None
  monkeypatch.setattr(config, "MAX_CACHE_ENTRY_BYTES", 1000)
  s.put("big", b"x" * 1001)
  assert s.get("big") is None and not os.path.exists(s.path("big"))
  s.put("big", b"x" * 1000)
  assert s.get("big") == b"x" * 1000


def test_failed_writes_leave_no_temporary_files(store_dirs, monkeypatch):
  req, _ = store_dirs
  s = cache.Store("trial")
  s.put("k", b"first")
  before = all_files(req)
  os.unlink(s.path("k"))
  os.mkdir(s.path("k"))              # a directory in the way: os.replace fails
  s.put("k", b"second")
  assert s.get("k") is None
  os.rmdir(s.path("k"))
  def fail(*_): raise OSError(28, "No space left on device")
  monkeypatch.setattr(cache.os, "replace", fail)
  s.put("k", b"third")
  assert all_files(req) == [f for f in before if not f.endswith(".bin")], all_files(req)
  monkeypatch.undo()


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "sticky-world-writable", "symlink"])
def test_unsafe_cache_dir_warns_and_falls_back(store_dirs, tmp_path, how):
  req, default = store_dirs
  target = tmp_path / "target"
  target.mkdir()
  target.chmod({"group-writable": 0o770, "sticky-world-writable": 0o1777}.get(how, 0o777))
  if how == "symlink": req.symlink_to(target)
  else: target.rename(req)
  with pytest.warns(cache.CacheWarning, match=rf"not using the kernel cache directory {req}: users other than its "
                    rf"owner can write to it.*using {default} instead"):
    s = cache.Store("trial")
    s.put("k", b"v")
  assert s.get("k") == b"v"
  assert cache.root() == str(default) and s.path("k").startswith(str(default))
  assert os.listdir(req) == []


def test_all_candidates_unsafe_falls_back_to_a_private_tempdir(store_dirs, tmp_path, monkeypatch):
  req, default = store_dirs
  tmp = tmp_path / "tmp"
  for d in (req, default, tmp / f"fusegrad-cache-{os.geteuid()}"):
    d.mkdir(parents=True)
    d.chmod(0o777)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp))
  with pytest.warns(cache.CacheWarning, match=f"using {tmp}/fusegrad-cache-"):
    r = cache.root()
  assert r.startswith(str(tmp)) and os.stat(r).st_mode & 0o777 == 0o700 and os.stat(r).st_uid == os.geteuid()
  s = cache.Store("trial")
  s.put("k", b"v")
  assert s.get("k") == b"v"


def fake_stat(mode: int, uid: int, size: int = 32) -> os.stat_result:
  return os.stat_result((mode, 0, 0, 1, uid, 0, size, 0, 0, 0))


def test_dir_and_key_file_checks_on_given_stats():
  me = 1000
  assert cache.dir_problem(fake_stat(stat.S_IFDIR | 0o700, me), me) is None
  assert cache.dir_problem(fake_stat(stat.S_IFDIR | 0o755, me), me) is None
  assert "owned by uid 0, not by this user (uid 1000)" in cache.dir_problem(fake_stat(stat.S_IFDIR | 0o700, 0), me)
  assert "can write" in cache.dir_problem(fake_stat(stat.S_IFDIR | 0o720, me), me)
  assert "can write" in cache.dir_problem(fake_stat(stat.S_IFDIR | 0o1777, me), me)
  assert "not a directory" in cache.dir_problem(fake_stat(stat.S_IFREG | 0o700, me), me)
  assert cache.key_file_problem(fake_stat(stat.S_IFREG | 0o600, me), me) is None
  assert "owned by uid 1001" in cache.key_file_problem(fake_stat(stat.S_IFREG | 0o600, 1001), me)
  assert "read or write" in cache.key_file_problem(fake_stat(stat.S_IFREG | 0o644, me), me)
  assert "not a regular file" in cache.key_file_problem(fake_stat(stat.S_IFIFO | 0o600, me), me)
  assert "holds 31 bytes" in cache.key_file_problem(fake_stat(stat.S_IFREG | 0o600, me, 31), me)


@pytest.mark.parametrize("how", ["readable", "symlink", "fifo", "short"])
def test_bad_key_file_is_replaced_and_old_entries_rebuilt(store_dirs, tmp_path, how):
  req, _ = store_dirs
  s = cache.Store("trial")
  s.put("k", b"v")
  key = req / "secret.key"
  key.unlink()
  if how == "readable":
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
  elif how == "symlink":
    other = tmp_path / "other.key"
    other.write_bytes(os.urandom(32))
    other.chmod(0o600)
    key.symlink_to(other)
  elif how == "fifo":
    os.mkfifo(key, 0o600)
  else:
    key.write_bytes(b"short")
    key.chmod(0o600)
  cache.reset()
  with pytest.warns(cache.CacheWarning, match=f"refusing the kernel-cache key file {key}"):
    assert get_within(s, "k") is None     # written under the old key: rebuilt, not trusted
  assert key.is_file() and not key.is_symlink() and os.stat(key).st_mode & 0o777 == 0o600
  assert os.path.getsize(key) == 32
  s.put("k", b"w")
  assert s.get("k") == b"w"
