"""The kernel-variant table moved to ops/tuning/kernels.py. This name stays for older imports (`from
lilicorr_runtime.ops import warm`): importing it yields that module itself, so what is read or set on it (tests'
patches) is the table's."""

import sys

from .tuning import kernels
from .tuning.kernels import *  # noqa: F403 - its names, for readers and type checkers

sys.modules[__name__] = kernels
