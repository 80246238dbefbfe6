"""The kernel optimizer: actions (actions.py) applied to a canonical Kernel, chosen per device by heuristic.py."""
from fusegrad.codegen.opt.actions import Opt, OptOp, OptError, apply_opt, apply_opts  # noqa: F401
