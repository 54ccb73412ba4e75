"""`python -m lilicorr_runtime.train ...`, the training recipe's earlier name, forwards to `python -m lilicorr_train`
(which lives beside the runtime in a checkout, and is not in the wheel)."""

import sys

try:
    from lilicorr_train.__main__ import main
except ModuleNotFoundError as exc:
    if exc.name != "lilicorr_train":
        raise
    sys.stderr.write(
        "python -m lilicorr_runtime.train: the training recipe is not installed: it is "
        "`python -m lilicorr_train`, run from a checkout of the lilicorr-ckpt repository "
        "(docs/training.md)\n"
    )
    raise SystemExit(4) from None

if __name__ == "__main__":
    main()
