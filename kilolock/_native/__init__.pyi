"""Typed interface of kl's native extension (codec_rs/, built by maturin into kilolock/_native),
one submodule per job: ``codec`` (the Rust codec backend), ``transport`` (kl's HTTP/2 client for
provider plugins) and ``p256`` (the AutoMTLS client key and its signature)."""
from kilolock._native import codec as codec
from kilolock._native import p256 as p256
from kilolock._native import transport as transport

__version__: str
