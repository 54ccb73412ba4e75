"""The training CLI's inputs go through the guarded reader too: a FIFO given as data or as RUN/state.pt is refused
by name, never opened for reading (np.load and torch.load would block on it forever)."""

from __future__ import annotations

import os

from lilicorr_train.data import DataError, Dataset

from helpers import raised_within


def test_training_data_that_is_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    raised = raised_within(10, Dataset.load, fifo)
    assert isinstance(raised, DataError), raised  # the training CLI prints it as one line, exit 2
    assert str(raised) == (
        f"{fifo} is not training data this tool can read: it is a FIFO (named pipe), not a regular "
        "file (never opened)"
    )
