"""The on-disk cache: authenticated bytes by key, across processes (compiled programs today).

Trust model (docs/architecture.md, "Cache trust model"): only the user's own account is trusted. The cache
directory must be owned by this user and writable by nobody else, or it is refused with a warning and a
private directory is used instead. Every entry carries an HMAC-SHA256, under a secret key kept in the cache
directory (0600), over (format tag, store name, key, payload): an entry this user's fusegrad did not write for
exactly that key -- planted, copied from another key, mutated -- is a miss, rebuilt and overwritten, never
returned. Only regular files of bounded size are read (no symlinks, FIFOs or devices), so a hostile
entry can neither hang a reader nor exhaust its memory.

One entry is one file: a JSON header line (format, store, key, payload size, hmac) then the payload.
"""
from __future__ import annotations
import atexit
import hashlib
import hmac
import json
import os
import shutil
import stat
import struct
import tempfile
import threading
import warnings
from fusegrad import config

_FORMAT = "fusegrad-cache-2"
_KEY_FILE = "secret.key"
_SECRET_BYTES = 32
_HEADER_MAX = 4096        # a header line is ~300 bytes; anything longer is not ours
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class CacheWarning(UserWarning):
  """The cache directory or its key file was refused; fusegrad goes on with a safe substitute."""


def key_of(*parts: str) -> str:
  h = hashlib.sha256()
  for p in parts: h.update(p.encode() + b"\0")
  return h.hexdigest()


# ---- permission checks (pure functions of stat results, so tests can feed them any owner) ----

def dir_problem(st: os.stat_result, uid: int) -> str | None:
  """Why a directory with this stat cannot hold the cache for user uid, or None when it can."""
  if not stat.S_ISDIR(st.st_mode): return "it is not a directory"
  if st.st_uid != uid: return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
  if st.st_mode & 0o022:
    return f"users other than its owner can write to it (mode {stat.S_IMODE(st.st_mode):04o}; chmod 700 fixes that)"
  return None


def key_file_problem(st: os.stat_result, uid: int) -> str | None:
  """Why a file with this stat cannot be the secret key for user uid, or None when it can."""
  if not stat.S_ISREG(st.st_mode): return "it is not a regular file"
  if st.st_uid != uid: return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
  if st.st_mode & 0o077: return f"users other than its owner can read or write it (mode {stat.S_IMODE(st.st_mode):04o})"
  if st.st_size != _SECRET_BYTES: return f"it holds {st.st_size} bytes, not {_SECRET_BYTES}"
  return None


# ---- file primitives ----

def _read_regular(path: str, limit: int) -> bytes | None:
  """The contents of path if it is a regular file (not a symlink, FIFO or device) of at most limit bytes."""
  try:
    fd = os.open(path, _O_READ)   # O_NOFOLLOW: a symlink fails; O_NONBLOCK: a FIFO opens without a writer
  except OSError:
    return None
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit: return None
    chunks, n = [], 0
    while True:
      b = os.read(fd, min(1 << 20, limit + 1 - n))
      if not b: break
      chunks.append(b)
      n += len(b)
      if n > limit: return None   # grew while we read it
    return b"".join(chunks)
  except OSError:
    return None
  finally:
    os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
  """Write path as a whole (0600, tmp + rename): a reader sees the old file or the new one. Raises OSError;
  the temporary file never outlives a failure."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".part")   # mkstemp: 0600
  try:
    with os.fdopen(fd, "wb") as f: f.write(data)
    os.replace(tmp, path)
    tmp = None
  finally:
    if tmp is not None:
      try:
        os.unlink(tmp)
      except OSError:
        pass


# ---- the cache root: a checked directory and its secret key, resolved once per process ----

class _Root:
  def __init__(self, path: str | None, secret: bytes | None):
    self.path, self.secret = path, secret


_root: _Root | None = None
_root_lock = threading.Lock()


def _warn(msg: str) -> None: warnings.warn(msg, CacheWarning, stacklevel=4)


def _checked_dir(path: str) -> tuple[str | None, str | None]:
  """(real path, None) if path is (or was just made) a directory that only this user can write, else
  (None, why). A symlink is judged by what it points to."""
  try:
    os.makedirs(path, mode=0o700, exist_ok=True)
    real = os.path.realpath(path)
    st = os.stat(real)
  except OSError as e:
    return None, f"it cannot be created or examined ({e.strerror or e})"
  why = dir_problem(st, os.geteuid())
  return (real, None) if why is None else (None, why)


def _read_secret(path: str, uid: int) -> tuple[bytes | None, str | None]:
  """(key, None), or (None, why it was refused), or (None, None) when there is no key file."""
  try:
    fd = os.open(path, _O_READ)
  except FileNotFoundError:
    return None, None
  except OSError as e:
    return None, f"it cannot be opened as a regular file ({e.strerror or e})"
  try:
    why = key_file_problem(os.fstat(fd), uid)
    if why is not None: return None, why
    secret = os.read(fd, _SECRET_BYTES + 1)
    return (secret, None) if len(secret) == _SECRET_BYTES else (None, "it changed size while being read")
  except OSError as e:
    return None, f"it cannot be read ({e.strerror or e})"
  finally:
    os.close(fd)


def _load_secret(dirpath: str) -> bytes | None:
  """The secret key in dirpath, created on first use; a refused key file is replaced once. None: no usable key."""
  path = os.path.join(dirpath, _KEY_FILE)
  uid = os.geteuid()
  why = None
  for attempt in range(3):
    secret, why = _read_secret(path, uid)
    if secret is not None: return secret
    if attempt == 2 or (why is not None and attempt > 0): break
    try:
      if why is None:
        # first use: write a whole key beside it, then link it into place; os.link fails if another process
        # got there first, and then both use that process's key
        fd, tmp = tempfile.mkstemp(dir=dirpath, prefix=".tmp-", suffix=".key")
        try:
          with os.fdopen(fd, "wb") as f: f.write(os.urandom(_SECRET_BYTES))
          try:
            os.link(tmp, path)
          except FileExistsError:
            pass
        finally:
          os.unlink(tmp)
      else:
        _warn(f"fusegrad: refusing the kernel-cache key file {path}: {why}; writing a new key (cached kernels "
              "will be rebuilt)")
        _write_atomic(path, os.urandom(_SECRET_BYTES))
    except OSError as e:
      why = f"a new key cannot be written ({e.strerror or e})"
      break
  _warn(f"fusegrad: no usable kernel-cache key in {dirpath} ({why or 'it keeps disappearing'}); "
        "the disk cache is off for this process")
  return None


def _resolve() -> _Root:
  requested = os.path.abspath(os.path.expanduser(config.CACHE_DIR))
  fallbacks = [os.path.abspath(config.DEFAULT_CACHE_DIR),
               os.path.join(tempfile.gettempdir(), f"fusegrad-cache-{os.geteuid()}")]
  real, why = _checked_dir(requested)
  if real is None:
    for cand in dict.fromkeys(fallbacks):
      if cand == requested: continue
      real, _ = _checked_dir(cand)
      if real is not None: break
    else:
      try:
        real = tempfile.mkdtemp(prefix="fusegrad-cache-")   # private (0700), this process only
        atexit.register(shutil.rmtree, real, True)
      except OSError:
        real = None
    _warn(f"fusegrad: not using the kernel cache directory {requested}: {why}; "
          + (f"using {real} instead" if real else "the disk cache is off for this process"))
  if real is None: return _Root(None, None)
  secret = _load_secret(real)
  return _Root(real if secret else None, secret)


def root() -> str | None:
  """The directory in use (None: disk cache off), checked and keyed on first call."""
  return _get_root().path


def _get_root() -> _Root:
  global _root
  r = _root
  if r is None:
    with _root_lock:
      if _root is None: _root = _resolve()
      r = _root
  return r


def reset() -> None:
  """Forget the resolved directory and key (tests change config.CACHE_DIR between cases)."""
  global _root
  with _root_lock: _root = None


def seal(secret: bytes, store: str, key: str, payload: bytes) -> str:
  """The HMAC-SHA256 of an entry: every part length-prefixed, so no two (store, key, payload) share a message."""
  m = hmac.new(secret, digestmod=hashlib.sha256)
  for part in (_FORMAT.encode(), store.encode(), key.encode(), payload):
    m.update(struct.pack("<Q", len(part)))
    m.update(part)
  return m.hexdigest()


class Store:
  """Bytes by key string, authenticated, in one named part of the on-disk cache. Compiled programs live in
  `programs`; another kind of result (a kernel search's choices, say) takes its own Store(name)."""

  def __init__(self, name: str):
    if not name.isidentifier(): raise ValueError(f"cache store name must be an identifier, got {name!r}")
    self.name = name

  def path(self, key: str) -> str | None:
    """The file that holds key's entry (None: disk cache off)."""
    r = _get_root().path
    if r is None: return None
    h = hashlib.sha256(self.name.encode() + b"\0" + key.encode()).hexdigest()
    return os.path.join(r, self.name, h[:2], h + ".bin")

  def get(self, key: str) -> bytes | None:
    """key's payload, or None when there is none this user's fusegrad wrote for exactly this key."""
    if config.DISABLE_DISK_CACHE: return None
    path = self.path(key)
    if path is None: return None
    data = _read_regular(path, config.MAX_CACHE_ENTRY_BYTES + _HEADER_MAX)
    if data is None: return None
    header, nl, payload = data.partition(b"\n")
    if not nl or len(header) > _HEADER_MAX: return None
    try:
      h = json.loads(header.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):   # RecursionError: "[[[[..." nested too deep
      return None
    if not isinstance(h, dict) or h.get("format") != _FORMAT or h.get("store") != self.name or h.get("key") != key:
      return None
    mac = h.get("hmac")
    # compare_digest refuses non-ASCII str (a header can hold any JSON string): compare ASCII only
    if h.get("size") != len(payload) or not isinstance(mac, str) or not mac.isascii(): return None
    if not hmac.compare_digest(mac, seal(_get_root().secret, self.name, key, payload)): return None
    return payload

  def put(self, key: str, payload: bytes) -> None:
    """Store payload under key; a failure (read-only or full disk, a directory in the way) only costs a
    rebuild next time."""
    if config.DISABLE_DISK_CACHE or len(payload) > config.MAX_CACHE_ENTRY_BYTES: return
    path = self.path(key)
    if path is None: return
    header = json.dumps({"format": _FORMAT, "store": self.name, "key": key, "size": len(payload),
                         "hmac": seal(_get_root().secret, self.name, key, payload)}).encode() + b"\n"
    try:
      shard = os.path.dirname(path)
      for d in (os.path.dirname(shard), shard):   # makedirs gives only the last level the mode asked for
        if not os.path.isdir(d): os.makedirs(d, mode=0o700, exist_ok=True)
      _write_atomic(path, header + payload)
    except OSError:
      pass


programs = Store("programs")   # compiled kernels: CPU shared libraries, OpenCL program binaries


def get(key: str) -> bytes | None: return programs.get(key)
def put(key: str, payload: bytes) -> None: programs.put(key, payload)
