"""The one road from a canonical Kernel to source: actions -> passes -> linearize -> render. The runtime
(Device.compiled) and the search both call it, so what is searched is what runs.

  optimize(k, caps, opts)  the actions (the device's heuristic when opts is None) applied: codegen/opt
  prepare(k, caps, ...)    optimized, a tensor core's tile made the warp's Mma, tiles staged in local memory,
                           register axes expanded, work items bound,
                           equal values of a work-group's phases merged (passes.dedupe), linearized
"""
from __future__ import annotations
from dataclasses import dataclass
from fusegrad.codegen.ir import Kernel, SHARED_KINDS
from fusegrad.codegen.renderer.base import Caps
from fusegrad.codegen.opt import apply_opts, heuristic
from fusegrad.codegen.opt.actions import OptOp
from fusegrad.codegen import passes
from fusegrad.codegen.linearize import linearize


@dataclass(frozen=True)
class Prepared:
  kernel: Kernel       # what is launched: its global_size, local_size and cost are the optimized kernel's
  listing: list        # the typed statements (codegen/linearize.py)
  opts: tuple          # the actions applied


def optimize(k: Kernel, caps: Caps, opts=None) -> Kernel:
  if opts is None: opts = heuristic.hand_coded(k, caps)
  return apply_opts(k, opts, caps)


def prepare(k: Kernel, caps: Caps, opts=None) -> Prepared:
  ko = optimize(k, caps, opts)
  ke, _, _ = passes.bind(passes.group(passes.expand(passes.stage(passes.tensor_core(ko)), caps)))
  # equal values merged where a work-group's phases meet at barriers (a shared axis: GROUP_REDUCE, GROUP_LOOP): a
  # device compiler merges equal values itself, but moves no global load past a barrier. After bind: a grouped
  # reduction's index and its output loop's are one lidx only there. Also where a reduction was unrolled (a CPU's row
  # kept in registers, heuristic._rows_in_registers: a softmax's exps, one per element in the listing, so the speed
  # does not hang on a C compiler's value numbering; gcc 12 merges them too). Other kernels keep their source as it was
  if ke.of_kind(*SHARED_KINDS) or any(o.op is OptOp.UNROLL for o in ko.opts): ke = passes.dedupe(ke)
  ke = passes.read_ahead(ke)
  return Prepared(ke, linearize(ke), ko.opts)
