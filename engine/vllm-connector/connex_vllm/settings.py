"""The connector's settings: parsed from ``kv_connector_extra_config``, checked at start.

Pure: no I/O. Unknown keys are an error that names them, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

RELEASE_MODES = ("on_finish", "after_pull")
ROLES = ("kv_producer", "kv_consumer")

_TOKEN = re.compile(r"^[^\s.*>]{1,128}$")


class SettingsError(ValueError):
    """A setting is missing, unknown or out of range; the message names the key."""


@dataclass(frozen=True)
class Settings:
    """What one ConnexConnector instance needs, with defaults documented inline."""

    member: str  # member_id of the connexd beside this engine (required)
    base_url: str  # root of this engine's OpenAI HTTP API, advertised for routers (required)
    nats_url: str = "nats://127.0.0.1:4222"  # NATS server of that connexd
    nats_creds: str = ""  # NATS credentials file of this engine (connexd auth creds --role engine ...); "" for none
    nats_tls_ca: str = ""  # CA certificate (PEM) that verifies the NATS server; "" for the system's
    release: str = ""  # on_finish | after_pull; "" uses the connexd's release setting
    retain_s: int = 0  # lease of a hold in seconds; 0 uses the connexd's retain_s
    call_timeout_s: float = 5.0  # deadline of one subject-API call
    pull_timeout_s: float = 30.0  # deadline of one KV pull (StartPullRequest.timeout_ms)
    connect_timeout_s: float = 10.0  # how long the first NATS connection may take at start
    register_ttl_ms: int = 0  # engine.register TTL; 0 uses the member's default (3 s)
    progress_every: int = 8  # generated tokens per request.progress checkpoint (batched, asynchronous)
    # The least time between two request.progress checkpoints of one request, so that a fast engine's checkpoints
    # (each a durable write of the request's record) come at a bounded rate, not one every few tokens. 0: no floor.
    progress_interval_ms: int = 200
    model: str = ""  # served model name to advertise; "" uses vLLM's served_model_name
    notice_poll_s: float = 1.0  # how often each half asks connexd for missed notices (and sees it restarted)
    pull_start_attempts: int = 3  # pull.start sends when its answer is lost (same pull id: one pull)
    # A prefill engine with holds and nothing else to do waits this long per engine step for new work (a request in
    # its input queue ends the wait within a millisecond) instead of stepping every millisecond: connex_vllm.idlewait.
    # Long, because each step also keeps vLLM's worker spinning for a second after it. 0: off.
    idle_wait_ms: int = 10000
    # A prefill engine's worker spins this long after each step (vLLM: 1 s) before it sleeps until the next one:
    # connex_vllm.spin. 1000: as vLLM.
    worker_spin_ms: int = 20


_DEFAULTS = Settings(member="", base_url="")
KEYS: tuple[str, ...] = tuple(Settings.__dataclass_fields__)


def _int(key: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SettingsError(f"kv_connector_extra_config[{key!r}] = {v!r}: want an integer in [{lo}, {hi}]")
    if not lo <= v <= hi:
        raise SettingsError(f"kv_connector_extra_config[{key!r}] = {v}: out of range [{lo}, {hi}]")
    return v


def _float(key: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SettingsError(f"kv_connector_extra_config[{key!r}] = {v!r}: want a number in [{lo}, {hi}]")
    if not lo <= float(v) <= hi:
        raise SettingsError(f"kv_connector_extra_config[{key!r}] = {v}: out of range [{lo}, {hi}]")
    return float(v)


def _str(key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise SettingsError(f"kv_connector_extra_config[{key!r}] = {v!r}: want a string")
    return v


def valid_token(s: str) -> bool:
    """Whether s can be one NATS subject token (member and engine ids), as connexd requires."""
    return bool(_TOKEN.match(s))


def parse(extra: dict[str, Any] | None) -> Settings:
    """Checks ``kv_connector_extra_config`` and returns the settings, or raises SettingsError naming the key."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(KEYS))
    if unknown:
        raise SettingsError(
            f"ConnexConnector: unknown kv_connector_extra_config key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(KEYS)}"
        )
    out: dict[str, Any] = {}
    for key in ("member", "base_url", "nats_url", "nats_creds", "nats_tls_ca", "release", "model"):
        if key in extra:
            out[key] = _str(key, extra[key])
    member = out.get("member", "")
    if not valid_token(member):
        raise SettingsError(
            f"kv_connector_extra_config['member'] = {member!r}: required, the member_id of the connexd beside "
            "this engine (one NATS subject token: no spaces, '.', '*' or '>')"
        )
    base = out.get("base_url", "")
    u = urlparse(base)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise SettingsError(
            f"kv_connector_extra_config['base_url'] = {base!r}: required, this engine's HTTP root that routers "
            "reach, e.g. http://10.0.0.7:8100"
        )
    nats_url = out.get("nats_url", _DEFAULTS.nats_url)
    if urlparse(nats_url).scheme not in ("nats", "tls", "ws", "wss"):
        raise SettingsError(f"kv_connector_extra_config['nats_url'] = {nats_url!r}: want nats://host:port")
    if out.get("release", "") not in ("", *RELEASE_MODES):
        raise SettingsError(
            f"kv_connector_extra_config['release'] = {out['release']!r}: allowed {', '.join(RELEASE_MODES)}"
        )
    if "retain_s" in extra:
        out["retain_s"] = _int("retain_s", extra["retain_s"], 1, 86400)
    if "register_ttl_ms" in extra:
        out["register_ttl_ms"] = _int("register_ttl_ms", extra["register_ttl_ms"], 500, 60000)
    if "pull_start_attempts" in extra:
        out["pull_start_attempts"] = _int("pull_start_attempts", extra["pull_start_attempts"], 1, 20)
    if "idle_wait_ms" in extra:
        out["idle_wait_ms"] = _int("idle_wait_ms", extra["idle_wait_ms"], 0, 60000)
    if "worker_spin_ms" in extra:
        out["worker_spin_ms"] = _int("worker_spin_ms", extra["worker_spin_ms"], 0, 1000)
    if "progress_every" in extra:
        out["progress_every"] = _int("progress_every", extra["progress_every"], 1, 1 << 20)
    if "progress_interval_ms" in extra:
        out["progress_interval_ms"] = _int("progress_interval_ms", extra["progress_interval_ms"], 0, 60000)
    for key, hi in (
        ("call_timeout_s", 600.0),
        ("pull_timeout_s", 3600.0),
        ("connect_timeout_s", 600.0),
        ("notice_poll_s", 60.0),
    ):
        if key in extra:
            out[key] = _float(key, extra[key], 0.001, hi)
    s = Settings(**{**_DEFAULTS.__dict__, **out})
    if s.retain_s and s.pull_timeout_s >= s.retain_s:
        raise SettingsError(
            f"kv_connector_extra_config: pull_timeout_s ({s.pull_timeout_s}) must stay below retain_s "
            f"({s.retain_s}): a pull must end within the hold's lease"
        )
    return s
