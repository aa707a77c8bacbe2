"""Fixtures for the codec suite: every test that takes ``impl`` runs once per backend."""
from __future__ import annotations

import types

import pytest

BUILD_HINT = (
    "the Rust codec is not built into this checkout: run "
    "`cargo build --release --manifest-path codec_rs/Cargo.toml && "
    "cp codec_rs/target/release/lib_codec_rs.so kilolock/_codec_rs.abi3.so` "
    "(or `maturin build --release` and unzip the wheel's .so into kilolock/)"
)


def load_backend(name: str) -> types.ModuleType:
    if name == "python":
        from kilolock.codec import pure

        return pure
    try:
        from kilolock import _codec_rs
    except ImportError as exc:
        pytest.fail(f"{BUILD_HINT} ({exc})")
    if not hasattr(_codec_rs, "compile_type"):
        pytest.fail(f"kilolock._codec_rs is the skeleton without a codec; {BUILD_HINT}")
    return _codec_rs


@pytest.fixture(params=["python", "rust"])
def impl(request: pytest.FixtureRequest) -> types.ModuleType:
    return load_backend(request.param)


@pytest.fixture
def both() -> tuple[types.ModuleType, types.ModuleType]:
    return load_backend("python"), load_backend("rust")


@pytest.fixture
def load() -> object:
    """``load("rust")`` / ``load("python")``: a backend module, failing with the build hint."""
    return load_backend
