"""fusegrad.utils: `fusegrad.utils.data` is fusegrad.data under PyTorch's path."""
from fusegrad.utils import data  # noqa: F401
