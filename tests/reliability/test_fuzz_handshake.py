"""Fuzzing the go-plugin handshake line parser: whatever a binary prints first, kl gets a usable
Handshake or one PluginStartError line that names the binary, never another exception.

Lines reach the parser as the launcher makes them (kilolock/provider/process.py): one stdout line
of at most 64 KiB, decoded as UTF-8 with replacement characters.
"""
from __future__ import annotations

import base64
import time

from hypothesis import example, given
from hypothesis import strategies as st

from kilolock.provider.errors import PluginStartError
from kilolock.provider.handshake import Handshake, parse_handshake
from kit.fuzz import FUZZ, RecordProperty, Tally, assert_one_line, hang_guard

BINARY = "/plugins/terraform-provider-fuzz_v1.0.0_x5"
MAX_LINE = 64 * 1024  # process._MAX_HANDSHAKE_LINE
# An error echoes what the binary sent, shortened: a 64 KiB line must not become a 64 KiB message.
MAX_MESSAGE = 400 + len(BINARY)

CERT = base64.b64encode(bytes(range(200))).decode().rstrip("=")
VALID = [f"1|5|unix|/tmp/plugin1234|grpc|{CERT}", "1|6|tcp|127.0.0.1:1234|grpc|", "1|5|unix|/tmp/p|grpc|\n",
         f"1|6|unix|/tmp/plugin/x.sock|grpc|{CERT}|true"]

# Per field: good values, near misses and junk (unicode digits, signs, spaces, empty, huge).
FIELD_VALUES = [
    ["1", "", "0", "2", "01", " 1", "+1", "-1", "¹", "١", "1\x00", "x" * 5000],
    ["5", "6", "4", "7", "", "05", "+5", "-5", " 5", "5 ", "²", "٥", "５", "5.0", "0x5", "9" * 400, "𝟓"],
    ["unix", "tcp", "", "UNIX", "udp", "pipe", "unix\x00", "tcp "],
    ["/tmp/plugin", "127.0.0.1:1", "", " ", "\x00", "/tmp/\x1b[31mred", "a" * 5000, "[::1]:80", "/tmp/\udcff"],
    ["grpc", "netrpc", "", "GRPC", "grpc\r", "\x1b[2J", "g" * 5000],
    ["", CERT, CERT + "!", CERT[:-1], "=" * 60, "A" * 51, "A" * 53, CERT + "====", "é" * 60, "-_" * 40],
    ["", "true", "false", "yes"],
]


@st.composite
def handshake_line(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 5))
    if kind == 0:  # field by field, from the near-miss tables (or random text for one field)
        n = draw(st.integers(1, len(FIELD_VALUES)))
        fields = [draw(st.sampled_from(values) | st.text(max_size=10)) for values in FIELD_VALUES[:n]]
        return "|".join(fields) + draw(st.sampled_from(["", "\n", "\r\n", " \n", "|", "||"]))
    if kind == 1:  # a valid line, mutated at one position
        line = draw(st.sampled_from(VALID))
        pos = draw(st.integers(0, len(line)))
        action = draw(st.sampled_from(["cut", "insert", "replace", "double"]))
        if action == "cut":
            return line[:pos]
        if action == "double":
            return line[:pos] + line[pos:] * 2
        piece = draw(st.text(min_size=1, max_size=4) | st.sampled_from(["|", "||", "\x00", "\r", "\ufffd", "²"]))
        return line[:pos] + piece + line[pos + (action == "replace"):]
    if kind == 2:  # bytes as the launcher decodes them
        return draw(st.binary(max_size=200)).decode("utf-8", errors="replace")
    if kind == 3:
        return draw(st.text(max_size=200))
    if kind == 4:  # the most pipes-and-digits alphabet
        return draw(st.text(alphabet="0123456789|unixtcpgr:/.-\n ", max_size=80))
    # Long lines, up to the launcher's cap.
    return draw(st.sampled_from(VALID)).rstrip("\n") + "|" + "A" * draw(st.integers(0, MAX_LINE - 100))


def check(line: str, tally: Tally) -> None:
    start = time.monotonic()
    try:
        hs = parse_handshake(line, BINARY)
    except PluginStartError as exc:
        message = str(exc)
        assert_one_line(message, f"handshake {line[:200]!r}")
        assert BINARY in message, f"error does not name the binary: {message!r}"
        assert len(message) <= MAX_MESSAGE, f"{len(message)}-character error for handshake {line[:100]!r}"
        assert message.isprintable(), f"error carries control characters: {message!r}"
        tally.count("error")
        return
    except Exception as exc:
        raise AssertionError(f"handshake {line[:200]!r}: {type(exc).__name__} instead of PluginStartError: {exc}") from exc
    finally:
        tally.timed(time.monotonic() - start)
    # What kl goes on to dial must be something that can be dialled.
    assert isinstance(hs, Handshake)
    assert hs.protocol_version in (5, 6)
    assert hs.network in ("unix", "tcp")
    assert hs.address and hs.address.isprintable(), f"accepted address {hs.address!r} from {line[:200]!r}"
    assert hs.server_cert_der is None or len(hs.server_cert_der) > 30
    tally.count("ok")


def test_fuzz_handshake_lines(record_property: RecordProperty) -> None:
    tally = Tally("handshake line parser")

    @FUZZ
    @given(handshake_line())
    # Found by this fuzzer: str.isdigit() is True for superscript digits, which int() rejects
    # (ValueError escaped the parser); an empty address and a control character in the echoed
    # RPC name went through.
    @example("1|²|unix|/tmp/p|grpc|")
    @example("1|5|unix||grpc|")
    @example("1|5|unix|/s|\x1b[2Jgrpc|")
    def run(line: str) -> None:
        check(line, tally)

    with hang_guard():
        run()
    tally.finish(record_property)


def test_valid_lines_still_parse() -> None:
    """The fuzz property must not pass by rejecting everything."""
    for line in VALID:
        hs = parse_handshake(line, BINARY)
        assert hs.protocol_version in (5, 6) and hs.address
