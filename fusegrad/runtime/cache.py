"""The on-disk program cache: compiled binaries keyed by (source, compiler, flags, host).

Each entry is one file: a JSON header line (format tag, key, payload length and sha256) followed by
the payload. An entry whose header, key, length or checksum does not match is treated as missing
and overwritten, so a truncated, corrupt or foreign file is never loaded.
"""
from __future__ import annotations
import hashlib
import json
import os
import tempfile
from fusegrad import config

_FORMAT = "fusegrad-cache-1"


def key_of(*parts: str) -> str:
  h = hashlib.sha256()
  for p in parts: h.update(p.encode() + b"\0")
  return h.hexdigest()


def _path(key: str) -> str: return os.path.join(config.CACHE_DIR, key[:2], key + ".bin")


def get(key: str) -> bytes | None:
  if config.DISABLE_DISK_CACHE: return None
  try:
    with open(_path(key), "rb") as f:
      header = json.loads(f.readline().decode())
      payload = f.read()
  except (OSError, ValueError, UnicodeDecodeError):
    return None
  if not isinstance(header, dict) or header.get("format") != _FORMAT or header.get("key") != key: return None
  if header.get("size") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest(): return None
  return payload


def put(key: str, payload: bytes) -> None:
  if config.DISABLE_DISK_CACHE: return
  path = _path(key)
  header = json.dumps({"format": _FORMAT, "key": key, "size": len(payload),
                       "sha256": hashlib.sha256(payload).hexdigest()}).encode() + b"\n"
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f: f.write(header + payload)
    os.replace(tmp, path)   # atomic: another process sees the old entry or the whole new one
  except OSError:
    pass                    # a read-only or full cache dir only costs a recompile next time
