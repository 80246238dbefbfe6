"""Realize: schedule the graph behind some nodes, then compile and run each kernel in order.

Several threads may realize at once, the same nodes too: scheduling and setting a node's result hold
schedule.lock (so a schedule sees the graph in one state), compiling and launching do not. A node two
threads compute at once is computed twice; the first result stored is kept (the values are equal).
"""
from __future__ import annotations
import time
from fusegrad.graph import node as gn
from fusegrad.graph.node import Node
from fusegrad.runtime import device as rd
from fusegrad.schedule import schedule as sched
from fusegrad.schedule.schedule import create_schedule
from fusegrad.engine import track, jit


def realize(*nodes: Node) -> None:
  for item in create_schedule(list(nodes)):
    out = item.outputs[0]
    dev = rd.get(out.device)
    if item.kind == "KERNEL":
      _run_kernel(item, dev)
      continue
    if item.kind == "EMPTY":
      buf = rd.Buffer(dev, 0, out.dtype)
    elif item.kind == "COPY":
      src = item.inputs[0].buffer
      buf = rd.Buffer(dev, out.numel, out.dtype)
      if out.numel: buf.copyin(src.numpy())
      track.record_copy()
      if (rec := jit.recorder()) is not None: rec.copy(src, buf)
    _set_result(out, buf)


def _run_kernel(item, dev) -> None:
  k = item.kernel
  for b in k.bufs:
    if b.dtype not in dev.supported:
      raise RuntimeError(f"device {dev.name} cannot run dtype {b.dtype.name}")
  bufs = [rd.Buffer(dev, o.numel, o.dtype) for o in item.outputs]
  if item.outputs[0].numel:
    c = dev.compiled(k)
    everything = bufs + [i.buffer for i in item.inputs]
    launch(dev, c.program, c.kernel, c.source, [b.handle for b in everything])
    if (rec := jit.recorder()) is not None: rec.kernel(dev, c.program, c.kernel, c.source, everything, len(bufs))
  for o, b in zip(item.outputs, bufs): _set_result(o, b)


def _set_result(n: Node, buf) -> None:
  """n is computed into buf: it stands for n now (unless another thread stored n's value first)."""
  with sched.lock:
    if n.buffer is None: n.buffer = buf
    gn.forget(n)


def launch(dev, program, k, src: str, handles: list) -> None:
  """Run one compiled kernel (k: the optimized kernel of Device.compiled) on its buffers' handles (outputs first),
  timed when someone tracks kernels."""
  if not track.wants_timing():
    dev.launch(program, k, handles)
    return
  t0 = time.perf_counter()
  dev.launch(program, k, handles)
  dev.synchronize()
  nbytes = sum(b.size * b.dtype.itemsize for b in k.bufs)
  track.record(track.KernelRecord(k.name, dev.name, src, (k.global_size,), k.local_size,
                                  time.perf_counter() - t0, k.flops, nbytes, k.opts))
