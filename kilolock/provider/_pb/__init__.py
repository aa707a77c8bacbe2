"""Protobuf message modules generated from proto/ by scripts/gen_proto.py."""
