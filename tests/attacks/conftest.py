"""Fixtures shared by the attack, signal and extraction tests."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Every module here trains or scores tiny models on one torch thread."""
