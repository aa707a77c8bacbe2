from __future__ import annotations

import base64

import pytest

from kilolock.provider.errors import PluginStartError
from kilolock.provider.handshake import parse_handshake


def test_plain_unix_handshake() -> None:
    hs = parse_handshake("1|5|unix|/tmp/plugin123|grpc|\n", "bin")
    assert (hs.protocol_version, hs.network, hs.address, hs.server_cert_der) == (5, "unix", "/tmp/plugin123", None)
    assert hs.grpc_target == "unix:/tmp/plugin123"


def test_tcp_and_protocol_6() -> None:
    hs = parse_handshake("1|6|tcp|127.0.0.1:10001|grpc|", "bin")
    assert hs.protocol_version == 6 and hs.grpc_target == "127.0.0.1:10001"


def test_server_cert_is_raw_std_base64_without_padding() -> None:
    der = bytes(range(256)) + b"\x01"  # 257 bytes: base64 would need padding
    field = base64.b64encode(der).decode().rstrip("=")
    assert not field.endswith("=")
    hs = parse_handshake(f"1|5|unix|/s|grpc|{field}|true", "bin")
    assert hs.server_cert_der == der


@pytest.mark.parametrize(
    "line, expected",
    [
        ("hello world", "is not a Terraform provider plugin"),
        ("", "is not a Terraform provider plugin"),
        ("2|5|unix|/s|grpc|", "core protocol '2'"),
        ("1|4|unix|/s|grpc|", "plugin protocol '4'"),
        ("1|x|unix|/s|grpc|", "plugin protocol 'x'"),
        ("1|5|unix|/s|netrpc|", "speaks netrpc"),
        ("1|5|unix|/s", "speaks netrpc"),
        ("1|5|pipe|/s|grpc|", "unknown network 'pipe'"),
        ("1|5|unix|/s|grpc|" + "!" * 60, "not valid base64"),
    ],
)
def test_bad_handshakes_name_the_binary_and_the_problem(line: str, expected: str) -> None:
    with pytest.raises(PluginStartError) as err:
        parse_handshake(line, "/opt/terraform-provider-x")
    assert expected in str(err.value) and "/opt/terraform-provider-x" in str(err.value)
