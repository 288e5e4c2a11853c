"""When moving a session's KV to a call's new worker is worth waiting for (SAGA §5.2 step 3).

A placement that names a ``kv_source`` (``Decision.kv_source``: SAGA's stolen sessions) may move
the session's cached prefix to its new worker before the call starts there.  The call waits for
the transfer only when the transfer is shorter than recomputing what it would save: the whole
blocks of the prompt that the prefix covers and the new worker does not cache yet.  Otherwise, or
when nothing would be saved, the call starts at once and recomputes.
"""

from __future__ import annotations


def worth_moving(saved_tokens: int, transfer_s: float, recompute_s: float) -> bool:
    """Wait for a KV transfer of ``transfer_s`` seconds that spares the target recomputing
    ``saved_tokens`` prompt tokens, which would take ``recompute_s`` seconds?"""
    return saved_tokens > 0 and transfer_s < recompute_s
