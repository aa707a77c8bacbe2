#!/usr/bin/env python3
"""A fault-injecting stand-in for a provider plugin (never a replacement for the real ones).

Behaviour is chosen by FAKE_MODE at start-up and by the resource type name per ReadResource:
  modes: serve (default), hang, garbage, not-plugin, exit-early, wrong-cookie, netrpc, proto4
  types: fake_echo, fake_sensitive (adds field 6; FAKE_SENSITIVE_GARBAGE=1: a malformed one), fake_crash, fake_slow (FAKE_SLOW_SECONDS),
         fake_error, fake_gone, and bad answers: fake_garbage (not msgpack), fake_unknown (an
         unknown value), fake_wrongtype (a number where the schema says string), fake_flood
         (FAKE_FLOOD_MB of stderr before a good answer), fake_api (a cloud API with a capacity, below)
FAKE_PROTO selects protocol 5 or 6. FAKE_UPGRADE=object makes UpgradeResourceState
answer with a real msgpack object (so Terraform itself can use the fake). FAKE_EVENT_LOG, if set, is a file the fake appends "read",
"stop" and "shutdown" to when those RPCs arrive, so tests can see what kl sent. AutoMTLS follows go-plugin: PLUGIN_CLIENT_CERT turns it on and
the server certificate goes out base64 (raw std, no padding) in handshake field 6.
Echoes, for the secrets tests (a provider repeating what it was given): FAKE_ECHO_CONFIG_TO_STDERR=1
writes the configured token to stderr (an hclog JSON line and a plain one); FAKE_ECHO_STATE_TO_STDERR=1
writes every ReadResource's current state there; FAKE_ECHO_STATE_IN_DIAGNOSTIC=1 puts the `secret`
attribute into fake_error's diagnostic detail. FAKE_READ_SET='{"attr": "new value"}' makes
ReadResource answer with those attributes changed (drift). FAKE_REPORT_ENV=A,B appends "env A=set" or
"env A=unset" per name to FAKE_EVENT_LOG at start-up (never the value). ReadResource appends "+read"
to the private data it is given, so every read changes the state, unless FAKE_READ_PRIVATE=keep (a
read that finds the object as it was, as most of a real fleet's do).
Capacity model (issue 18), for fake_api reads: FAKE_CAPACITY=C (default 50) and FAKE_LATENCY=L0
(seconds, default 0.05): with n fake_api reads in flight (this one included) a read takes L0 while
n <= C and L0 * n / C above (the API queues: throughput stays C / L0), and above 3C it is answered
at once with an AWS-style throttling diagnostic (`api error Throttling: Rate exceeded`, with
"throttled" appended to FAKE_EVENT_LOG). The server has enough threads for 3C + 64 calls at once.
FAKE_CONCURRENCY_FILE=PATH counts ReadResource calls in flight across all the fake's processes
("now max" in PATH, under an flock): what a fleet-wide limit test asserts on.
"""
from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import threading
import time
from concurrent import futures

COOKIE = ("TF_PLUGIN_MAGIC_COOKIE", "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2")


# ReadResource answers that break the protocol's contract in one way each (cty msgpack objects of
# the fake's schema: id, rule, secret, value).
BAD_ANSWERS = {
    "fake_garbage": b"\xc1\xc1 not msgpack",
    "fake_unknown": b"\x84\xa2id\xd4\x00\x00\xa4rule\x90\xa6secret\xc0\xa5value\xa1v",
    "fake_wrongtype": b"\x84\xa2id\x2a\xa4rule\x90\xa6secret\xc0\xa5value\xa1v",
}


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    mode = os.environ.get("FAKE_MODE", "serve")
    if mode == "wrong-cookie" or os.environ.get(COOKIE[0]) != COOKIE[1]:
        sys.stderr.write("This binary is a plugin. These are not meant to be executed directly.\n")
        sys.exit(1)
    if mode == "hang":
        time.sleep(3600)
    if mode == "garbage":
        say("Welcome to the fake tool! \x00\x01 totally not a handshake")
        time.sleep(3600)
    if mode == "not-plugin":
        say("usage: fake-tool [options] FILE")
        sys.exit(0)
    if mode == "exit-early":
        sys.stderr.write("fake: loading configuration\nfake: fatal: cannot open /nonexistent/config.yml\n")
        sys.stderr.flush()
        sys.exit(3)
    if mode == "netrpc":
        say("1|5|unix|/tmp/nothing-here|netrpc|")
        time.sleep(3600)
    if mode == "proto4":
        say("1|4|unix|/tmp/nothing-here|grpc|")
        time.sleep(3600)
    serve()


def serve() -> None:
    import grpc
    from google.protobuf import empty_pb2

    from kilolock.provider import certs
    from kilolock.provider._pb import grpc_controller_pb2, grpc_health_pb2, grpc_stdio_pb2, tfplugin5_pb2, tfplugin6_pb2

    proto = int(os.environ.get("FAKE_PROTO", "5"))
    pb = tfplugin5_pb2 if proto == 5 else tfplugin6_pb2
    names = (
        {"schema": "GetSchema", "validate": "PrepareProviderConfig", "configure": "Configure", "stop": "Stop"}
        if proto == 5
        else {"schema": "GetProviderSchema", "validate": "ValidateProviderConfig", "configure": "ConfigureProvider", "stop": "StopProvider"}
    )
    stop_event = threading.Event()
    done = threading.Event()
    for name in filter(None, os.environ.get("FAKE_REPORT_ENV", "").split(",")):
        if os.environ.get("FAKE_EVENT_LOG"):
            with open(os.environ["FAKE_EVENT_LOG"], "a") as fh:
                fh.write(f"env {name}={'set' if name in os.environ else 'unset'}\n")
    slow = float(os.environ.get("FAKE_SLOW_SECONDS", "5"))
    capacity = int(os.environ.get("FAKE_CAPACITY", "50"))
    base_latency = float(os.environ.get("FAKE_LATENCY", "0.05"))
    api = {"in_flight": 0}
    api_lock = threading.Lock()

    def event(name: str) -> None:
        if os.environ.get("FAKE_EVENT_LOG"):
            with open(os.environ["FAKE_EVENT_LOG"], "a") as fh:
                fh.write(name + "\n")

    def attr(name: str, typ: bytes, **flags: bool) -> object:
        return pb.Schema.Attribute(name=name, type=typ, **flags)

    def get_schema(req, ctx):
        block = pb.Schema.Block(
            attributes=[
                attr("id", b'"string"', computed=True),
                attr("value", b'"string"', optional=True),
                attr("secret", b'"string"', optional=True, sensitive=True),
            ],
            block_types=[
                pb.Schema.NestedBlock(
                    type_name="rule",
                    nesting=pb.Schema.NestedBlock.LIST,
                    max_items=3,
                    block=pb.Schema.Block(attributes=[attr("cidr", b'"string"', required=True)]),
                )
            ],
        )
        provider_block = pb.Schema.Block(attributes=[attr("token", b'"string"', optional=True, sensitive=True)])
        resp = pb.GetProviderSchema.Response(provider=pb.Schema(block=provider_block))
        for t in ("fake_echo", "fake_sensitive", "fake_crash", "fake_slow", "fake_error", "fake_gone", *BAD_ANSWERS, "fake_flood",
                  "fake_api"):
            resp.resource_schemas[t].CopyFrom(pb.Schema(version=2, block=block))
        return resp

    def identity(req, ctx):
        resp = pb.GetResourceIdentitySchemas.Response()
        ident = resp.identity_schemas["fake_echo"]
        ident.version = 1
        ident.identity_attributes.add(name="id", type=b'"string"', required_for_import=True, description="the id")
        ident.identity_attributes.add(name="region", type=b'"string"', optional_for_import=True)
        return resp

    def validate(req, ctx):
        return getattr(pb, names["validate"]).Response()

    def configure(req, ctx):
        # The config arrives as msgpack; the fake only needs to show tests what token it got.
        raw = req.config.msgpack
        marker = b"\xa5token"
        if marker in raw:
            rest = raw[raw.index(marker) + len(marker):]
            token = rest[1:1 + (rest[0] & 0x1F)].decode() if rest[:1] and 0xA0 <= rest[0] <= 0xBF else "(null)"
            event(f"configure token={token}")
            if os.environ.get("FAKE_ECHO_CONFIG_TO_STDERR"):
                import json

                sys.stderr.write(json.dumps({"@level": "debug", "@message": "configuring", "@module": "fake", "token": token}) + "\n")
                sys.stderr.write(f"[DEBUG] fake: configured with token {token}\n")
                sys.stderr.flush()
        return getattr(pb, names["configure"]).Response()

    def upgrade(req, ctx):
        if req.version > 2:
            d = pb.Diagnostic(severity=pb.Diagnostic.ERROR, summary="newer state", detail=f"version {req.version}")
            return pb.UpgradeResourceState.Response(diagnostics=[d])
        if os.environ.get("FAKE_UPGRADE") == "object":  # a real upgrade, for Terraform to read
            import json

            import msgpack

            value = json.loads(req.raw_state.json)
            obj = {k: value.get(k) for k in ("id", "rule", "secret", "value")}
            return pb.UpgradeResourceState.Response(upgraded_state=pb.DynamicValue(msgpack=msgpack.packb(obj)))
        # Echo the JSON as an opaque marker; the fake never needs to decode it.
        return pb.UpgradeResourceState.Response(upgraded_state=pb.DynamicValue(msgpack=b"\xc4" + bytes([len(req.raw_state.json)]) + req.raw_state.json))

    def validate_resource(req, ctx) -> bytes:
        return b""  # an empty Response: no diagnostics (kl's protos do not declare this RPC's messages)

    def read(req, ctx) -> bytes:
        event("read")
        t = req.type_name
        private = req.private if os.environ.get("FAKE_READ_PRIVATE") == "keep" else req.private + b"+read"
        resp = pb.ReadResource.Response(new_state=req.current_state, private=private)
        echo_state = os.environ.get("FAKE_ECHO_STATE_TO_STDERR") or os.environ.get("FAKE_ECHO_STATE_IN_DIAGNOSTIC")
        if echo_state or os.environ.get("FAKE_READ_SET"):
            import json

            import msgpack

            current = msgpack.unpackb(req.current_state.msgpack)
            if os.environ.get("FAKE_ECHO_STATE_TO_STDERR"):
                sys.stderr.write(json.dumps({"@level": "debug", "@message": "read", "@module": "fake", "state": current}) + "\n")
                sys.stderr.write(f"fake: reading {current!r}\n")
                sys.stderr.flush()
            if os.environ.get("FAKE_READ_SET"):
                resp.new_state.msgpack = msgpack.packb({**current, **json.loads(os.environ["FAKE_READ_SET"])})
        if req.HasField("current_identity"):
            resp.new_identity.CopyFrom(req.current_identity)
        if t == "fake_crash":
            sys.stderr.write("panic: fake provider crashed on purpose\n")
            sys.stderr.flush()
            os._exit(2)
        if t == "fake_slow":
            stop_event.wait(slow)
            if stop_event.is_set():
                resp.diagnostics.add(severity=pb.Diagnostic.ERROR, summary="cancelled by StopProvider")
        if t == "fake_api":
            with api_lock:
                api["in_flight"] += 1
                n = api["in_flight"]
            try:
                if n > 3 * capacity:
                    event("throttled")
                    resp.diagnostics.add(severity=pb.Diagnostic.ERROR, summary="reading fake_api",
                                         detail="operation error Fake: DescribeThings, https response error StatusCode: 400, "
                                                "api error Throttling: Rate exceeded")
                else:
                    stop_event.wait(base_latency * max(1.0, n / capacity))
            finally:
                with api_lock:
                    api["in_flight"] -= 1
        if t == "fake_error":
            detail = "the rule is wrong"
            if os.environ.get("FAKE_ECHO_STATE_IN_DIAGNOSTIC"):
                detail += f" (secret was {current.get('secret')!r})"
            d = resp.diagnostics.add(severity=pb.Diagnostic.ERROR, summary="Invalid thing", detail=detail)
            d.attribute.steps.add(attribute_name="rule")
            d.attribute.steps.add(element_key_int=1)
            d.attribute.steps.add(attribute_name="cidr")
            resp.diagnostics.add(severity=pb.Diagnostic.WARNING, summary="just a warning")
        if t == "fake_gone":
            resp.ClearField("new_state")
        if t in BAD_ANSWERS:
            resp.new_state.msgpack = BAD_ANSWERS[t]
        if t == "fake_flood":
            line = b"flood: " + b"x" * 1017 + b"\n"
            for _ in range(int(float(os.environ.get("FAKE_FLOOD_MB", "20")) * 1024)):
                os.write(2, line)
        raw = resp.SerializeToString()
        if t == "fake_sensitive" and os.environ.get("FAKE_SENSITIVE_GARBAGE"):
            raw += b"\x32\x02\x0a\x00"  # field 6 holding an AttributePath whose one step has no selector
        elif t == "fake_sensitive":
            for steps in (("secret",), ("tags", "k")):
                path = pb.AttributePath()
                path.steps.add(attribute_name=steps[0])
                if len(steps) > 1:
                    path.steps.add(element_key_string=steps[1])
                body = path.SerializeToString()
                raw += bytes([0x32, len(body)]) + body  # field 6, length-delimited
        return raw

    def stop(req, ctx):
        event("stop")
        stop_event.set()
        return getattr(pb, names["stop"]).Response()

    def shutdown(req, ctx):
        event("shutdown")
        done.set()
        return grpc_controller_pb2.Empty()

    def health(req, ctx):
        return grpc_health_pb2.HealthCheckResponse(status=grpc_health_pb2.HealthCheckResponse.SERVING)

    def stdio(req, ctx):
        yield grpc_stdio_pb2.StdioData(channel=grpc_stdio_pb2.StdioData.STDERR, data=b"hello from StreamStdio\n")
        done.wait()

    def counted(fn):
        """FAKE_CONCURRENCY_FILE: count ReadResource calls in flight across every process of the fake
        (a fleet-wide limit's test): the file holds "now max", updated under an flock."""
        path = os.environ.get("FAKE_CONCURRENCY_FILE")
        if not path:
            return fn
        import fcntl

        def bump(delta: int) -> None:
            with open(path, "a+") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.seek(0)
                now, top = (int(x) for x in (fh.read().split() or ["0", "0"]))
                now += delta
                fh.seek(0)
                fh.truncate()
                fh.write(f"{now} {max(top, now)}\n")

        def wrapped(req, ctx):
            bump(1)
            try:
                return fn(req, ctx)
            finally:
                bump(-1)
        return wrapped

    def h(fn, req_cls, raw=False):
        ser = (lambda b: b) if raw else (lambda m: m.SerializeToString())
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req_cls.FromString, response_serializer=ser)

    service = f"tfplugin{proto}.Provider"
    handlers = [
        grpc.method_handlers_generic_handler(
            service,
            {
                names["schema"]: h(get_schema, pb.GetProviderSchema.Request),
                "GetResourceIdentitySchemas": h(identity, pb.GetResourceIdentitySchemas.Request),
                names["validate"]: h(validate, getattr(pb, names["validate"]).Request),
                names["configure"]: h(configure, getattr(pb, names["configure"]).Request),
                "UpgradeResourceState": h(upgrade, pb.UpgradeResourceState.Request),
                ("ValidateResourceTypeConfig" if proto == 5 else "ValidateResourceConfig"): grpc.unary_unary_rpc_method_handler(
                    validate_resource, request_deserializer=lambda b: b, response_serializer=lambda b: b
                ),
                "ReadResource": h(counted(read), pb.ReadResource.Request, raw=True),
                names["stop"]: h(stop, getattr(pb, names["stop"]).Request),
            },
        ),
        grpc.method_handlers_generic_handler("plugin.GRPCController", {"Shutdown": h(shutdown, grpc_controller_pb2.Empty)}),
        grpc.method_handlers_generic_handler(
            "plugin.GRPCStdio",
            {
                "StreamStdio": grpc.unary_stream_rpc_method_handler(
                    stdio, request_deserializer=empty_pb2.Empty.FromString, response_serializer=lambda m: m.SerializeToString()
                )
            },
        ),
        grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": h(health, grpc_health_pb2.HealthCheckRequest)}),
    ]
    # Enough threads that the capacity model, not the server's pool, decides what a caller waits for.
    workers = 3 * capacity + 64 if "FAKE_CAPACITY" in os.environ else 16
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), handlers=handlers)
    sock_dir = os.environ.get("PLUGIN_UNIX_SOCKET_DIR") or tempfile.gettempdir()
    sock = os.path.join(sock_dir, f"fakeplugin{os.getpid()}")
    client_pem = os.environ.get("PLUGIN_CLIENT_CERT")
    cert_field = ""
    if client_pem:
        own = certs.generate_client_certificate()  # same shape serves as a server cert (serverAuth EKU)
        creds = grpc.ssl_server_credentials([(own.key_pem, own.cert_pem)], root_certificates=client_pem.encode(), require_client_auth=True)
        server.add_secure_port(f"unix:{sock}", creds)
        shown = certs.generate_client_certificate() if os.environ.get("FAKE_BAD_CERT") else own  # a lie: TLS must fail
        cert_field = base64.b64encode(shown.cert_der).decode().rstrip("=")
    else:
        server.add_insecure_port(f"unix:{sock}")
    server.start()
    sys.stderr.write(json.dumps({"@level": "info", "@message": "fake provider serving", "@module": "fake", "proto": proto}, separators=(",", ":")) + "\n")
    sys.stderr.flush()
    # Plain text, not hclog JSON, as tests read these two in the stderr tail, which skips JSON chatter.
    sys.stderr.write("fake: client cert %s\n" % ("present" if client_pem else "absent"))
    sys.stderr.write("fake: TF_LOG_SDK_PROTO={}\n".format(os.environ.get("TF_LOG_SDK_PROTO", "(unset)")))
    sys.stderr.write('{"@level":"trace","@message":"fake trace line"}\n')
    sys.stderr.flush()
    say(f"1|{proto}|unix|{sock}|grpc|{cert_field}")
    done.wait()
    server.stop(0)
    os._exit(0)


if __name__ == "__main__":
    main()
