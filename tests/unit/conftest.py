"""Fixtures shared by the unit tests that run the stand-in engines and proxy as processes on 127.0.0.1."""

import pytest

from tests.fixtures.standin_procs import Servers


@pytest.fixture
def servers(tmp_path):
    """Stand-in engines and proxies started by the test, all stopped after it."""
    s = Servers(tmp_path)
    yield s
    s.stop_all()
