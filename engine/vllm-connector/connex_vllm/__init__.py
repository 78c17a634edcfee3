"""Connex for vLLM: ``ConnexConnector``, a KV connector over a local connexd.

Load it with ``--kv-transfer-config '{"kv_connector": "ConnexConnector", "kv_connector_module_path": "connex_vllm",
...}'``. The vLLM import happens only when the connector class is asked for, so the settings and wire helpers
import without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConnexConnector"]


def __getattr__(name: str) -> Any:
    if name == "ConnexConnector":
        from .connector import ConnexConnector

        return ConnexConnector
    raise AttributeError(name)
