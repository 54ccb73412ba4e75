"""The tile table moved to ops/tuning/tables.py. This name stays for older imports (`from lilicorr_runtime.ops import
tiles`): importing it yields that module itself, so what is read or set on it (tests' patches) is the tuner's."""

import sys

from .tuning import tables
from .tuning.tables import *  # noqa: F403 - its names, for readers and type checkers

sys.modules[__name__] = tables
