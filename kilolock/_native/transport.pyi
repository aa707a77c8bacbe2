"""kl's gRPC client for provider plugins (codec_rs/src/transport.rs)."""
from typing import final

__version__: str

@final
class H2Channel:
    """One HTTP/2 connection to a plugin for its gRPC calls (codec_rs/src/transport.rs), used by
    kilolock.provider.h2channel. Raises OSError when it cannot connect."""
    def __init__(self, target: str, max_message_bytes: int,
                 tls: tuple[bytes, bytes, bytes] | None = None) -> None:
        """``tls``: (server certificate DER, client certificate PEM, client key PEM) for AutoMTLS."""
    def wake_fd(self) -> int:
        """Readable when completions wait; read it empty, then call drain()."""
    def call(self, id: int, path: str, message: bytes, timeout: float | None = None) -> None:
        """Queues a unary call, started at the next flush(); its completion comes out of drain() with this id."""
    def flush(self) -> None:
        """Starts every queued call (one wake-up of the runtime's thread for all of them)."""
    def drain(self) -> list[tuple[int, int, bytes | str]]:
        """(id, 0, answer bytes) or (id, gRPC status code, message) for every finished call."""
    def call_blocking(self, path: str, message: bytes, timeout: float | None = None) -> tuple[int, bytes | str]:
        """A unary call from a thread, waited for without the GIL: (0, answer bytes) or (gRPC
        status code, message). Signals are checked every tenth of a second (Ctrl-C interrupts)."""
    def stream(self, path: str, message: bytes) -> H2Stream:
        """Starts a server-streaming call."""
    def close(self) -> None:
        """Ends the connection; calls in flight never complete (blocking ones return UNAVAILABLE)."""

@final
class H2Stream:
    """The messages of one server-streaming call, then its end."""
    def recv(self, timeout: float) -> bytes | tuple[int, str] | None:
        """The next message's bytes, or the end as (gRPC status code, message), 0 for OK; None when
        nothing came within ``timeout`` seconds (waited for without the GIL)."""
