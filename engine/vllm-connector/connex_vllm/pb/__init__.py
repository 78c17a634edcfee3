"""Protobuf classes of the Connex wire, generated from messages/*.proto by gen-proto.sh (do not edit)."""
