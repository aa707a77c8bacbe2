"""The committed protobuf stubs must be exactly what scripts/gen_proto.py makes from proto/."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_the_proto_files(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.generate(tmp_path)
    committed_dir = ROOT / "kilolock" / "provider" / "_pb"
    fresh = {p.name: p.read_bytes() for p in written}
    committed = {p.name: p.read_bytes() for p in committed_dir.glob("*.py")}
    assert set(fresh) == set(committed), "stub files differ from proto/: run python scripts/gen_proto.py"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not stale, f"stale stubs {stale}: run python scripts/gen_proto.py (with the grpcio-tools version pinned for dev)"


def test_field_numbers_that_differ_between_v5_and_v6() -> None:
    from kilolock.provider._pb import tfplugin5_pb2 as v5
    from kilolock.provider._pb import tfplugin6_pb2 as v6

    a5 = v5.Schema.Attribute.DESCRIPTOR.fields_by_name
    a6 = v6.Schema.Attribute.DESCRIPTOR.fields_by_name
    assert (a5["write_only"].number, a5["deprecation_message"].number) == (10, 11)
    assert (a6["nested_type"].number, a6["write_only"].number, a6["deprecation_message"].number) == (10, 11, 12)
    assert v6.Schema.Block.DESCRIPTOR.fields_by_name["computed"].number == 8
    assert v6.ValidateProviderConfig.Response.DESCRIPTOR.fields_by_name["diagnostics"].number == 2
    for pb in (v5, v6):
        req = pb.ReadResource.Request.DESCRIPTOR.fields_by_name
        assert req["current_identity"].number == 6
        resp = pb.ReadResource.Response.DESCRIPTOR.fields_by_name
        assert resp["new_identity"].number == 5 and 6 not in {f.number for f in resp.values()}
