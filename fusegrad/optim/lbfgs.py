"""L-BFGS: torch.optim.LBFGS, with its strong-Wolfe line search.

L-BFGS decides on the host at every iteration (curvature tests, line-search brackets, stopping rules), so it is
written the straightforward way: the flattened parameters and gradients come to the host as numpy arrays of the
parameters' dtype, the two-loop recursion and the line search run there in that dtype (torch's float32 scalars
included), and each step writes the parameters back. It cannot be captured by fusegrad.jit (its Python decides
how many closure evaluations a step makes): stepping it inside a jitted function is refused.
"""
from __future__ import annotations
import numpy as np
import fusegrad as fg
from fusegrad.engine import jit as _jit
from fusegrad.optim import Optimizer
from fusegrad.tensor import Tensor

__all__ = ["LBFGS"]


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
  """The minimizer of the cubic through (x1, f1, g1) and (x2, f2, g2), clipped to bounds (minFunc's polyinterp)."""
  xmin_bound, xmax_bound = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
  d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
  d2_square = d1 ** 2 - g1 * g2
  if d2_square >= 0:
    d2 = np.sqrt(d2_square)
    if x1 <= x2: min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else: min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(min_pos, xmin_bound), xmax_bound)
  return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
  """torch's line search satisfying the strong Wolfe conditions: returns (loss, flat grad, step, evaluations)."""
  d_norm = np.abs(d).max()
  g = g.copy()
  f_new, g_new = obj_func(x, t, d)
  ls_func_evals = 1
  gtd_new = g_new.dot(d)
  t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
  done = False
  ls_iter = 0
  while ls_iter < max_ls:   # bracket an interval containing a point satisfying the conditions
    if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
      bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()], [gtd_prev, gtd_new]
      break
    if abs(gtd_new) <= -c2 * gtd:
      bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
      done = True
      break
    if gtd_new >= 0:
      bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()], [gtd_prev, gtd_new]
      break
    min_step = t + 0.01 * (t - t_prev)
    max_step = t * 10
    tmp = t
    t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
    t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.copy(), gtd_new
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals += 1
    gtd_new = g_new.dot(d)
    ls_iter += 1
  if ls_iter == max_ls:
    bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]
  insuf_progress = False
  low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
  while not done and ls_iter < max_ls:   # zoom into the bracket
    if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change: break
    t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
    eps = 0.1 * (max(bracket) - min(bracket))
    if min(max(bracket) - t, t - min(bracket)) < eps:
      if insuf_progress or t >= max(bracket) or t <= min(bracket):
        t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
        insuf_progress = False
      else:
        insuf_progress = True
    else:
      insuf_progress = False
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals += 1
    gtd_new = g_new.dot(d)
    ls_iter += 1
    if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
      bracket[high_pos], bracket_f[high_pos], bracket_g[high_pos], bracket_gtd[high_pos] = t, f_new, g_new.copy(), gtd_new
      low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
    else:
      if abs(gtd_new) <= -c2 * gtd:
        done = True
      elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
        bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
        bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
      bracket[low_pos], bracket_f[low_pos], bracket_g[low_pos], bracket_gtd[low_pos] = t, f_new, g_new.copy(), gtd_new
  return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


def _host(v):
  """A state value as the host keeps it: tensors (fusegrad's or torch's) become numpy arrays, lists stay lists."""
  if isinstance(v, list): return [_host(x) for x in v]
  if isinstance(v, Tensor): return v.numpy().copy()
  if hasattr(v, "__array__") and not isinstance(v, (int, float, bool)):
    a = np.asarray(v)
    return a.reshape(()).item() if a.ndim == 0 and a.dtype.kind in "iu" else (a[()] if a.ndim == 0 else a.copy())
  return v


class LBFGS(Optimizer):
  """torch.optim.LBFGS: one parameter group; `step(closure)` re-evaluates the loss up to max_eval times."""

  def __init__(self, params, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
               tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
               line_search_fn: str | None = None):
    if not 0.0 <= lr: raise ValueError(f"Invalid learning rate: {lr}")
    if max_eval is None: max_eval = max_iter * 5 // 4
    super().__init__(params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                                  tolerance_change=tolerance_change, history_size=history_size,
                                  line_search_fn=line_search_fn))
    if len(self.param_groups) != 1:
      raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
    self._params = self.param_groups[0]["params"]

  def _hyper(self, group, state):   # not used: step() is its own
    return []

  def _update(self, p, grad, group, state, s):
    raise NotImplementedError

  def _dtype(self):
    return np.dtype(self._params[0].dtype.np)

  def _gather_flat_grad(self) -> np.ndarray:
    views = [np.zeros(p.numel(), self._dtype()) if p.grad is None else p.grad.numpy().reshape(-1).astype(self._dtype())
             for p in self._params]
    return np.concatenate(views)

  def _flat_params(self) -> list:
    return [p.numpy().copy() for p in self._params]

  def _set_params(self, values: list) -> None:
    with fg.no_grad():
      for p, v in zip(self._params, values):
        p.copy_(fg.tensor(np.ascontiguousarray(v).reshape(p.shape), dtype=p.dtype, device=p.device))
    fg.realize(*self._params)

  def _add_grad(self, step_size, update: np.ndarray) -> None:
    """p += step_size * update (torch's add_ with alpha: the step in the parameters' dtype)."""
    dtype = self._dtype()
    off, new = 0, []
    for p in self._params:
      n = p.numel()
      new.append(p.numpy().reshape(-1) + dtype.type(step_size) * update[off:off + n])
      off += n
    self._set_params(new)

  def _directional_evaluate(self, closure, x, t, d):
    self._add_grad(t, d)
    loss = float(closure())
    flat_grad = self._gather_flat_grad()
    self._set_params(x)
    return loss, flat_grad

  def load_state_dict(self, state_dict: dict) -> None:
    """Load torch's (or this optimizer's) state: the history vectors come to the host as numpy arrays."""
    super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
    st = state_dict["state"]
    if st:
      first = next(iter(st.values()))
      self.state[self._params[0]] = {k: _host(v) for k, v in first.items()}

  def step(self, closure):  # type: ignore[override]
    """Up to max_iter L-BFGS iterations; closure clears the gradients, computes the loss, backpropagates and
    returns the loss. Returns the loss of the first evaluation."""
    if _jit.recorder() is not None:
      raise RuntimeError("fusegrad.jit: LBFGS.step cannot be captured: its line search and stopping rules decide on "
                         "the host how many times the closure runs; call it outside the jitted function")
    if closure is None: raise RuntimeError("LBFGS requires a closure that re-evaluates the model and returns the loss")
    group = self.param_groups[0]
    lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
    tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
    line_search_fn, history_size = group["line_search_fn"], group["history_size"]
    dtype = self._dtype()
    f32 = dtype.type

    def evaluate():
      with fg.enable_grad(): return closure()

    state = self.state[self._params[0]]
    state.setdefault("func_evals", 0)
    state.setdefault("n_iter", 0)
    orig_loss = evaluate()
    loss = float(orig_loss)
    current_evals = 1
    state["func_evals"] += 1
    flat_grad = self._gather_flat_grad()
    if np.abs(flat_grad).max() <= tolerance_grad: return orig_loss

    d, t = state.get("d"), state.get("t")
    old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
    H_diag, prev_flat_grad, prev_loss = state.get("H_diag"), state.get("prev_flat_grad"), state.get("prev_loss")
    n_iter = 0
    while n_iter < max_iter:
      n_iter += 1
      state["n_iter"] += 1
      if state["n_iter"] == 1:
        d = -flat_grad
        old_dirs, old_stps, ro = [], [], []
        H_diag = 1
      else:   # the two-loop recursion over the curvature pairs kept
        y = flat_grad - prev_flat_grad
        s = d * f32(t)
        ys = y.dot(s)
        if ys > 1e-10:
          if len(old_dirs) == history_size:
            old_dirs.pop(0); old_stps.pop(0); ro.pop(0)
          old_dirs.append(y)
          old_stps.append(s)
          ro.append(f32(1.0) / ys)
          H_diag = ys / y.dot(y)
        num_old = len(old_dirs)
        if "al" not in state: state["al"] = [None] * history_size
        al = state["al"]
        q = -flat_grad
        for i in range(num_old - 1, -1, -1):
          al[i] = old_stps[i].dot(q) * ro[i]
          q = q - f32(al[i]) * old_dirs[i]
        d = r = q * f32(H_diag)
        for i in range(num_old):
          be_i = old_dirs[i].dot(r) * ro[i]
          r = r + f32(al[i] - be_i) * old_stps[i]
        d = r
      prev_flat_grad = flat_grad.copy()
      prev_loss = loss
      if state["n_iter"] == 1: t = min(f32(1.0), f32(1.0) / np.abs(flat_grad).sum()) * lr
      else: t = lr
      gtd = flat_grad.dot(d)
      if gtd > -tolerance_change: break

      ls_func_evals = 0
      if line_search_fn is not None:
        if line_search_fn != "strong_wolfe": raise RuntimeError("only 'strong_wolfe' is supported")
        x_init = self._flat_params()
        loss, flat_grad, t, ls_func_evals = _strong_wolfe(
          lambda x, tt, dd: self._directional_evaluate(evaluate, x, tt, dd), x_init, t, d, loss, flat_grad, gtd,
          max_ls=max_eval - current_evals)
        self._add_grad(t, d)
        opt_cond = np.abs(flat_grad).max() <= tolerance_grad
      else:
        self._add_grad(t, d)
        opt_cond = False
        if n_iter != max_iter:
          loss = float(evaluate())
          flat_grad = self._gather_flat_grad()
          opt_cond = np.abs(flat_grad).max() <= tolerance_grad
          ls_func_evals = 1
      current_evals += ls_func_evals
      state["func_evals"] += ls_func_evals
      if n_iter == max_iter or current_evals >= max_eval or opt_cond: break
      if np.abs(d * f32(t)).max() <= tolerance_change: break
      if abs(loss - prev_loss) < tolerance_change: break

    state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                 prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
    return orig_loss
