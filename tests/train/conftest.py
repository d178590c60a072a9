"""Fixtures for training tests (helpers live in ``train_data.py``)."""

from __future__ import annotations

import pytest
from train_data import publish_rescored


@pytest.fixture(scope="module")
def rescored(tmp_path_factory) -> str:
    """A small rescored dataset: 4 groups x 4 episodes x 2 turns = 32 rows, half of them from solved episodes."""
    return publish_rescored(str(tmp_path_factory.mktemp("data") / "rescored"))
