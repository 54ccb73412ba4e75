"""The training recipe of a LiLiCorr drafter (docs/training.md): `python -m lilicorr_train`.

It builds on the runtime (the drafter's forward, the fast target) and is not in the lilicorr-ckpt wheel: it runs
from a checkout of the repository."""

import lilicorr_runtime  # noqa: F401  (first: without torch it says what to install, and `python -m` exits 4)
