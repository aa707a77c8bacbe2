"""The two codec backends under test: the pure-Python reference and the Rust extension."""
from __future__ import annotations

import types

import pytest

BUILD_HINT = (
    "the Rust codec is not built into this checkout: run "
    "`cargo build --release --manifest-path codec_rs/Cargo.toml && "
    "cp codec_rs/target/release/lib_native.so kilolock/_native.abi3.so` "
    "(or `maturin build --release` and unzip the wheel's .so into kilolock/)"
)


def load_backend(name: str) -> types.ModuleType:
    """kilolock.codec.pure for "python", kilolock._native.codec for "rust"; fails the test with the
    build hint when the Rust codec is missing."""
    if name == "python":
        from kilolock.codec import pure

        return pure
    try:
        from kilolock._native import codec
    except ImportError as exc:
        pytest.fail(f"{BUILD_HINT} ({exc})")
    return codec
