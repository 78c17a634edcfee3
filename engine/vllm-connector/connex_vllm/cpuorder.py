"""Whether vLLM's CPU attention keeps a block in the order connexd calls ``"cpu"``.

vLLM's CPU backend keeps each layer as ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``; what a (block,
head) page holds is its C++ kernel's choice, picked per instruction set (``_get_attn_isa``). The portable kernel
(``"vec"``) writes K transposed, ``[head_size][block_size]``, then V ``[block_size][head_size]``: connexd's
``cpu`` order, checked by the heterogeneous-block-size test against vLLM alone (e2e ``TestVLLM``). The AMX
kernel (bfloat16 on CPUs with AMX tiles) and the others pack K in their own tiles, not checked here: their
layouts are left undescribed, so blocks move whole between engines of one block size only (a pull between other
shapes is refused with ``incompatible``, never translated wrongly).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("connex_vllm")

# The kernels whose in-block order connexd's "cpu" order describes (checked against vLLM).
KNOWN_ISAS = frozenset({"vec"})


def known(vllm_config: Any, block_size: int) -> bool:
    """True when this engine's CPU attention kernel is one of KNOWN_ISAS. Any doubt (another platform, a
    vLLM without the function, a model config it cannot read) answers False: blocks then move whole only."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        if not current_platform.is_cpu():
            return False
        mc = vllm_config.model_config
        isa = _get_attn_isa(mc.dtype, block_size, mc.get_head_size(), str(vllm_config.cache_config.cache_dtype))
    except Exception as e:  # any failure means: not known
        log.info("connex: the CPU attention kernel's KV order is not known (%s): blocks move whole only", e)
        return False
    if isa not in KNOWN_ISAS:
        log.info(
            "connex: CPU attention kernel %r: its in-block KV order is not described; pulls between engines of "
            "other block sizes are refused",
            isa,
        )
        return False
    return True
