"""fusegrad.utils.data: PyTorch's path to fusegrad.data; every name here is the same object as there."""
from fusegrad.data import *  # noqa: F401,F403
from fusegrad.data import __all__  # noqa: F401
