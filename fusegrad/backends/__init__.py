"""fusegrad.backends: the switches PyTorch programs set (cudnn.benchmark, cuda.matmul.allow_tf32, ...), accepted
and recorded; none changes what fusegrad computes (it has no cuDNN, no TF32 and no MPS)."""
from fusegrad.backends import cudnn, cuda, mps  # noqa: F401
