"""The OPENCL device, through pyopencl: OpenCL C from codegen/renderer/cstyle.py, program binaries
cached on disk like the CPU's shared libraries, launches queued asynchronously (a copy out waits).
An evicted program (Device.programs is bounded) is released when the last reference to it goes.

pyopencl is an optional dependency (`pip install fusegrad[opencl]`, which brings PoCL for CPUs).
"""
from __future__ import annotations
import os
import shutil
import threading
from dataclasses import replace
import numpy as np
from fusegrad import dtype as dt, config as _config
from fusegrad.runtime import cache
from fusegrad.runtime.device import Device, CompileError, clip_log
from fusegrad.codegen.renderer.cstyle import OpenCLRenderer


class OpenCLDevice(Device):
  def __init__(self):
    try:
      import pyopencl as cl
    except ImportError:
      raise RuntimeError("device OPENCL needs pyopencl: pip install 'fusegrad[opencl]'") from None
    self.cl = cl
    platforms = cl.get_platforms()
    devices = [d for p in platforms for d in p.get_devices()]
    if not devices: raise RuntimeError("device OPENCL: pyopencl found no OpenCL device")
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    self.cl_device = (gpus or devices)[0]
    self.ctx = cl.Context([self.cl_device])
    self.queue = cl.CommandQueue(self.ctx)
    supported = set(dt.ALL)
    if "cl_khr_fp64" not in self.cl_device.extensions: supported.discard(dt.float64)
    super().__init__("OPENCL", OpenCLRenderer(), frozenset(supported))
    # float32 division and sqrt correctly rounded, as C's, PyTorch's and the interpreter's: OpenCL allows 2.5 ulp
    # (NVIDIA's driver takes it) unless asked, where the device can
    exact = self.cl_device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
    self._options = ["-cl-fp32-correctly-rounded-divide-sqrt"] if exact else []
    if self.cl_device.type & cl.device_type.GPU:
      # a GPU: work-groups and coalesced reads instead of a CPU's register blocking (codegen/opt/heuristic.py)
      cores = self._tensor_cores()
      if cores: self.renderer.caps = replace(self.renderer.caps, tensor_cores=cores)   # this instance spells them
      self._caps = replace(self.renderer.caps, max_local=min(int(self.cl_device.max_work_group_size), 1024),
                           local_bytes=int(self.cl_device.local_mem_size), prefers_blocking=False)
      # freed buffers kept for reuse: a GPU's own memory, up to a quarter of it (a 1 GiB result allocated afresh
      # each call cost about 1 ms on an H100)
      self.max_free_bytes = max(self.max_free_bytes, int(self.cl_device.global_mem_size) // 4)
    else: self._caps = self.renderer.caps
    self.compiles = 0
    # a kernel object's arguments are set, then it is enqueued: two threads launching one program at once
    # must not interleave (the in-order queue itself takes commands from any thread)
    self._launch_lock = threading.Lock()
    self._id = f"{self.cl_device.platform.name}|{self.cl_device.name}|{self.cl_device.version}|{self.cl_device.driver_version}"
    # PoCL's CPU driver links every kernel into a shared object with the system linker `ld`, which its clang
    # driver looks up on PATH, the first time the kernel is enqueued; without one it calls abort()
    plat = self.cl_device.platform
    self._needs_ld = bool(self.cl_device.type & cl.device_type.CPU) and \
        ("pocl" in plat.vendor.lower() or "portable computing language" in plat.name.lower())

  @property
  def caps(self): return self._caps

  def _tensor_cores(self) -> tuple:
    """The tensor cores of an NVIDIA GPU (codegen/opt/tc.py), which its OpenCL compiler reaches through inline PTX
    (mma.sync): by the compute capability (cl_nv_device_attribute_query); a later architecture takes Hopper's.
    FUSEGRAD_TENSOR_CORES=0 leaves them out."""
    from fusegrad.codegen.opt.tc import TENSOR_CORES
    d = self.cl_device
    if not _config.TENSOR_CORES or "cl_nv_device_attribute_query" not in d.extensions: return ()
    try: major, minor = int(d.compute_capability_major_nv), int(d.compute_capability_minor_nv)
    except Exception: return ()
    return TENSOR_CORES.get(f"sm_{major}{minor}", TENSOR_CORES["sm_90"] if major >= 9 else ())

  def alloc(self, nbytes: int): return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(nbytes, 1))
  def copyin(self, handle, src: np.ndarray) -> None: self.cl.enqueue_copy(self.queue, handle, src, is_blocking=True)
  def copyout(self, dst: np.ndarray, handle) -> None: self.cl.enqueue_copy(self.queue, dst, handle, is_blocking=True)
  def synchronize(self) -> None: self.queue.finish()

  def check_linker(self) -> None:
    """Raise a RuntimeError (instead of PoCL's SIGABRT at the first launch) when PoCL's CPU driver has no linker."""
    if self._needs_ld and shutil.which("ld") is None:
      raise RuntimeError("device OPENCL: PoCL's CPU driver links each kernel with the system linker `ld`, and "
                         f"there is no `ld` on PATH ({os.environ.get('PATH', '')!r}); PoCL would abort the process. "
                         "Install binutils (the package that provides ld) or add its directory to PATH")

  def compile(self, name: str, source: str):
    cl = self.cl
    self.check_linker()   # a cached binary is linked at its first launch too
    key = cache.key_of(source, "opencl", self._id, " ".join(self._options))
    binary = cache.programs.get(key)
    if binary is not None:
      try:
        prg = cl.Program(self.ctx, [self.cl_device], [binary]).build()
        return getattr(prg, name)
      except (cl.Error, cl.RuntimeError, cl.LogicError):
        pass    # a stale or foreign binary: build from source
    with self._launch_lock: self.compiles += 1
    try:
      prg = cl.Program(self.ctx, source).build(options=self._options)
    except cl.Error as e:
      raise CompileError(f"the OpenCL compiler rejected a kernel:\n{clip_log(str(e))}\n--- source ---\n{source}") from None
    try:
      cache.programs.put(key, prg.get_info(cl.program_info.BINARIES)[0])
    except cl.Error:
      pass
    return getattr(prg, name)

  @staticmethod
  def _param_dtype(d):
    return np.float32 if d in (dt.float16, dt.bfloat16) else d.np

  def param_handles(self, kernel, values: list) -> list:
    """Scalar kernel arguments (the renderer declares each Param in its register type: a 16-bit float's is float)."""
    return [np.array(v, dtype=self._param_dtype(d))[()] for d, v in zip(kernel.params, values)]

  def launch(self, program, kernel, handles: list) -> None: self.launch_batch([(program, kernel, handles)])

  def launch_batch(self, launches: list) -> None:
    """Enqueue the kernels, then flush the queue: the GPU starts on them now rather than at the next finish (NVIDIA's
    driver holds enqueued work a while: a 2^28 elementwise call 0.93-0.97 -> 0.90 ms on an H100)."""
    with self._launch_lock:
      for program, kernel, handles in launches:
        if kernel.params and not getattr(program, "_fg_typed", False):
          # declared scalar types let pyopencl pack the arguments directly (untyped scalars cost ~0.1 ms a launch)
          program.set_scalar_arg_dtypes([None] * len(kernel.bufs) + [self._param_dtype(d) for d in kernel.params])
          program._fg_typed = True
        program(self.queue, (kernel.global_size,), kernel.local_size, *handles)
      self.queue.flush()


def create() -> Device: return OpenCLDevice()
