"""``kl serve``'s option values (listen address, body size) and the exposure rule. Light imports only:
`kl serve --help` loads this for the token variables' names."""
from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

from kilolock.errors import UsageError

TOKEN_ENV = "KL_SERVE_TOKEN"
ADMIN_TOKEN_ENV = "KL_SERVE_ADMIN_TOKEN"
DEFAULT_MAX_BODY = 512 * 1024 * 1024  # a 100 MB state with room to spare


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise UsageError(f"--max-body {text!r}: expected a size like 104857600, 512K, 100M or 1G")
    n = int(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2).upper()]
    if n < 1024:
        raise UsageError(f"--max-body {text!r}: at least 1K, or no state fits")
    return n


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            # A host name: safe only if every address it resolves to is loopback.
            try:
                infos = socket.getaddrinfo(self.host, self.port, proto=socket.IPPROTO_TCP)
            except OSError:
                raise UsageError(f"--listen {self.host}: cannot resolve the host name") from None
            return all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def parse_listen(text: str) -> Listen:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host:
        raise UsageError(f"--listen {text!r}: the host is missing (use 0.0.0.0 for every interface)")
    return Listen(host, int(port))


def check_exposure(listen: Listen, auth_enabled: bool, tls: bool, insecure: bool) -> None:
    """State holds secrets: beyond loopback, require credentials and TLS unless forced."""
    if listen.loopback or insecure:
        return
    if not auth_enabled:
        raise UsageError(f"refusing to listen on {listen.host} without authentication: give --users-file or "
                         f"${TOKEN_ENV} (or --insecure to serve it anyway)")
    if not tls:
        raise UsageError(f"refusing to listen on {listen.host} without TLS: give --tls-cert and --tls-key "
                         "(or --insecure to send credentials and state in clear text anyway)")
