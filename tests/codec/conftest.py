"""Fixtures for the codec suite: every test that takes ``impl`` runs once per backend."""
from __future__ import annotations

import types
from collections.abc import Callable

import pytest

from kit.codec import load_backend


@pytest.fixture(params=["python", "rust"])
def impl(request: pytest.FixtureRequest) -> types.ModuleType:
    return load_backend(request.param)


@pytest.fixture
def both() -> tuple[types.ModuleType, types.ModuleType]:
    return load_backend("python"), load_backend("rust")


@pytest.fixture
def load() -> Callable[[str], types.ModuleType]:
    """``load("rust")`` / ``load("python")``: a backend module, failing with the build hint."""
    return load_backend
