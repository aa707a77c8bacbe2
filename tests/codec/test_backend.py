"""Backend selection (KL_CODEC) and the facts both backends must share."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import types
from collections.abc import Callable

import pytest

from kilolock import codec
from kilolock.codec import MAX_DEPTH, CodecError, abc
from kilolock.schema import Attribute, Block

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(env_value: str | None, code: str = "from kilolock import codec; print(codec.backend)") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KL_CODEC"}
    if env_value is not None:
        env["KL_CODEC"] = env_value
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("forced", ["python", "rust"])
def test_kl_codec_forces_a_backend(load: Callable[[str], types.ModuleType], forced: str) -> None:
    load(forced)  # fails with the build hint when the extension is missing
    result = _run(forced)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == forced


def test_default_prefers_rust(load: Callable[[str], types.ModuleType]) -> None:
    load("rust")
    assert _run(None).stdout.strip() == "rust"


def test_unknown_backend_is_an_error_that_says_why() -> None:
    result = _run("go")
    assert result.returncode != 0
    assert "KL_CODEC='go' is not a codec backend (use 'rust' or 'python')" in result.stderr


def test_forced_rust_that_cannot_load_says_why() -> None:
    # A meta-path hook that makes the extension unimportable, as on a host without it.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'kilolock._native': raise ImportError('no native codec here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from kilolock import codec\n"
    )
    result = _run("rust", code)
    assert result.returncode != 0
    assert "KL_CODEC=rust but the Rust codec cannot be loaded: no native codec here" in result.stderr
    fallback = _run(None, code + "print(codec.backend)")
    assert fallback.stdout.strip() == "python", fallback.stderr


def test_max_depth_is_the_same_in_both_backends(load: Callable[[str], types.ModuleType]) -> None:
    assert load("rust").MAX_DEPTH == MAX_DEPTH == 64


def test_public_api_compiles_types_and_blocks() -> None:
    t = codec.compile_type(b'["object",{"id":"string","triggers":["map","string"]}]')
    assert t.encode(b'{"id":"123"}') == bytes.fromhex("82a26964a3313233a87472696767657273c0")
    b = codec.compile_block(Block(attributes=(Attribute(name="id", type=b'"string"'),)))
    assert b.decode(b"\x81\xa2id\xa1x") == b'{"id":"x"}'
    assert b.type_json == b'["object",{"id":"string"}]'


def test_both_backends_provide_the_typed_api(impl: types.ModuleType) -> None:
    assert isinstance(impl, abc.Backend)
    t = impl.compile_type(b'"string"')
    assert isinstance(t, abc.CodecType)
    assert type(t).__name__ == "CodecType"


@pytest.mark.parametrize("bad", ["not bytes", 5, None])
def test_non_bytes_input_is_a_codec_error(impl: types.ModuleType, bad: object) -> None:
    t = impl.compile_type(b'"string"')
    with pytest.raises(CodecError, match="expected bytes"):
        t.encode(bad)
    with pytest.raises(CodecError, match="expected bytes"):
        t.decode(bad)
