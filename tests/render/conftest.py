"""Fixtures of the render tests (helpers live in pd_render_helpers.py)."""

import pytest


@pytest.fixture(scope="session")
def ansible_home(tmp_path_factory):
    return tmp_path_factory.mktemp("ansible_home")
