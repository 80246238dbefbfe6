"""What a CPU benchmark ran on, in one line for every bench script's header: the CPU's model, the vector ISA that
fusegrad's CPU device compiles for (FUSEGRAD_CPU_ISA may lower it), the C compiler, and the cores."""
from __future__ import annotations
import os
import platform


def describe() -> str:
  from fusegrad.runtime import cpu
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
  except OSError:
    pass
  try:
    isa = cpu.host_vectors()[2]
    cc = cpu.find_compiler()[1]
  except (RuntimeError, ValueError) as e:   # no compiler, or an ISA this CPU lacks
    isa, cc = "?", str(e)
  forced = "" if cpu.config.CPU_ISA == "native" else f" (FUSEGRAD_CPU_ISA={cpu.config.CPU_ISA})"
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return (f"{model}, fusegrad compiles for {isa}{forced} with {cc}, {os.cpu_count()} logical cores ({usable} usable), "
          f"{platform.system()} {platform.machine()}")
