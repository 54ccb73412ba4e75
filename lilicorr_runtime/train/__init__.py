"""The training recipe's earlier name: `python -m lilicorr_runtime.train` runs `python -m lilicorr_train`."""
