"""fusegrad.linalg: PyTorch's torch.linalg basics over the lazy graph.

Norms are reductions (ops_math.py). det, inv, solve and cholesky unroll their elimination over the matrix size
n: n steps of whole-matrix elementwise ops (partial pivoting by an argmax and a row gather), so they fuse and
differentiate like any composition; meant for small matrices (the graph grows with n). Singular or
non-positive-definite inputs give inf/NaN rather than PyTorch's LinAlgError, which would need the values read.
Left out: eig/eigh/svd/lstsq/pinv/matrix_rank/qr and the 2/-2/'nuc' matrix norms (iterative or
orthogonalizing algorithms with data-dependent convergence or sign conventions).
"""
from __future__ import annotations
from fusegrad import dtype as dt
from fusegrad.tensor import Tensor, arange, where
from fusegrad.ops_math import vector_norm, matrix_norm, linalg_norm as norm   # noqa: F401 (re-exported)


def _square(A: Tensor, name: str) -> None:
  if not isinstance(A, Tensor): raise TypeError(f"linalg.{name}(): argument 'A' must be Tensor, not {type(A).__name__}")
  if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
    raise RuntimeError(f"linalg.{name}: A must be batches of square matrices, but they are {' by '.join(map(str, A.shape[-2:]))} "
                       f"matrices (shape {A.shape})")
  if not A.dtype.is_float:
    raise RuntimeError(f"linalg.{name}: Expected a floating point or complex tensor as input. Got {A.dtype.name}")


def _pivot(M: Tensor, k: int, n: int):
  """Swap row k with the row (>= k) of the largest |M[..., r, k]|: (M, whether rows moved [...])"""
  rows = arange(M.shape[-2], device=M.device)
  col = where(rows >= k, M[..., :, k].abs(), -1.0)
  p = col.argmax(-1, keepdim=True)                                       # [..., 1]
  perm = where(rows == k, p, where(rows == p, k, rows))                  # [..., rows]
  M = M.gather(M.ndim - 2, perm.unsqueeze(-1).expand(*M.shape))
  return M, (p.squeeze(-1) != k)


def _eliminate(M: Tensor, n: int, jordan: bool):
  """Gaussian (jordan=False: below the pivot; returns the sign of the row permutation) or Gauss-Jordan elimination
  of the first n columns of M [..., n, m], with partial pivoting."""
  rows = arange(n, device=M.device).reshape(n, 1)
  sign = None
  for k in range(n):
    M, moved = _pivot(M, k, n)
    s = where(moved, -1.0, 1.0)._cast(M.dtype)
    sign = s if sign is None else sign * s
    piv = M[..., k:k + 1, :]                                              # [..., 1, m]
    if jordan:
      piv = piv / M[..., k:k + 1, k:k + 1]
      f = where(rows == k, 0.0, M[..., :, k:k + 1])
      M = where(rows == k, piv, M - f * piv)
    else:
      f = where(rows > k, M[..., :, k:k + 1] / M[..., k:k + 1, k:k + 1], 0.0)
      M = M - f * piv
  return M, sign


def det(A: Tensor) -> Tensor:
  _square(A, "det")
  n = A.shape[-1]
  if n == 0: return where(A.sum((-2, -1)) == 0, 1.0, 1.0)._cast(A.dtype)
  U, sign = _eliminate(A, n, jordan=False)
  return U.diagonal(0, -2, -1).prod(-1) * sign


def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
  _square(A, "solve")
  if not left: return solve(A.mT, B.mT).mT
  n = A.shape[-1]
  vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
  b = B.unsqueeze(-1) if vector else B
  if b.shape[-2] != n:
    raise RuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation AX = B ({A.shape[-2]}x{n} and "
                       f"{b.shape[-2]}x{b.shape[-1]})")
  from fusegrad.tensor import broadcast_shapes, cat
  batch = broadcast_shapes(A.shape[:-2], b.shape[:-2])
  d = dt.promote_types(A.dtype, b.dtype)
  M = cat([A._cast(d).expand(*batch, n, n), b._cast(d).expand(*batch, n, b.shape[-1])], -1)
  X = _eliminate(M, n, jordan=True)[0][..., n:]
  return X.squeeze(-1) if vector else X


def inv(A: Tensor) -> Tensor:
  _square(A, "inv")
  n = A.shape[-1]
  from fusegrad.tensor import eye
  return solve(A, eye(n, dtype=A.dtype, device=A.device).expand(*A.shape))


def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
  """L with A = L L^T, column by column; A is assumed symmetric (its symmetric part is factored, where PyTorch
  reads the lower triangle)."""
  _square(A, "cholesky")
  n = A.shape[-1]
  rows = arange(n, device=A.device).reshape(n, 1)
  cols = arange(n, device=A.device)
  # the symmetric part: the same values for a symmetric A, and PyTorch's symmetrized gradient
  A = (A + A.mT) * 0.5
  L = A * 0
  for j in range(n):
    c = A[..., :, j] - (L[..., :, :j] * L[..., j:j + 1, :j]).sum(-1) if j else A[..., :, j]   # [..., n]
    dj = c[..., j:j + 1].sqrt()
    col = where(rows.reshape(n) == j, dj, where(rows.reshape(n) > j, c / dj, 0.0))
    L = L + where(cols == j, col.unsqueeze(-1), 0.0)
  return L.mT if upper else L
