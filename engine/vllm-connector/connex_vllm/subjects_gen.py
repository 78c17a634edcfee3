# Code generated from api/subjects.go by `go generate ./api` (api/gencodes); DO NOT EDIT.
"""The subject API's table as connexd serves it: its prefix, every endpoint, the endpoints served only in the
member scope (members and admins call them; every other endpoint is also served in each engine's scope), and the
kinds of notice connexd publishes to engines."""

from __future__ import annotations

from typing import Final

PREFIX: Final = "connex.v1"

ENDPOINTS: Final = frozenset(
    {
        "engine.gone",
        "engine.notices",
        "engine.register",
        "engine.state",
        "hold.create",
        "hold.inspect",
        "hold.release",
        "hold.renew",
        "member.status",
        "peer.adopt",
        "peer.descriptors",
        "peer.grant",
        "peer.pullend",
        "pull.start",
        "region.create",
        "region.inspect",
        "region.register",
        "request.finish",
        "request.inspect",
        "request.progress",
        "request.start",
    }
)

MEMBER_ONLY: Final = frozenset(
    {
        "member.status",
        "peer.adopt",
        "peer.descriptors",
        "peer.grant",
        "peer.pullend",
    }
)

NOTICE_KINDS: Final = frozenset(
    {
        "blocks.freed",
        "hold.lost",
        "pull.done",
        "request.fenced",
        "request.resume",
    }
)
