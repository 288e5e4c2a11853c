"""The block-hash chains a finished sequence reports, hashed without stalling the event loop.

``sequence_hashes(prompt, output)`` costs about 1.5 us per 16-token block: 3 ms for a 32k-token
prompt, time every other stream on the loop would wait.  So the prompt's chain is started as soon
as the request is submitted -- on a thread when it is long -- and is ready long before the last
token; at the end only the response's blocks remain, usually a handful.  The result is exactly
``clairvoyant.core.blockhash.sequence_hashes(prompt_ids, output_ids)``:

    prompt  = chain(prompt_ids)                                   # full blocks only
    response = chain(prompt_ids[tail:] + output_ids, prompt[-1])  # tail: the prompt's partial block
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes

# Up to this many blocks (~0.1 ms) are hashed on the loop; more go to a thread (a hop costs ~0.08 ms).
INLINE_BLOCKS = 64


async def chain(token_ids: Sequence[int], previous: int = 0) -> list[int]:
    """``chain_hashes(token_ids, previous)``, on a thread when it is long enough to stall the loop."""
    if len(token_ids) < INLINE_BLOCKS * BLOCK_TOKENS:
        return chain_hashes(token_ids, previous)
    return await asyncio.to_thread(chain_hashes, list(token_ids), previous)


class SequenceHasher:
    """Hashes one sequence: the prompt's chain from construction on, the response's in ``finish``.

    Construct it inside a running event loop; call ``finish`` once, or ``cancel`` if the
    sequence never finishes (a thread already hashing runs on, its result is dropped).
    """

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self._prompt_ids = prompt_ids
        self._prompt = asyncio.ensure_future(chain(prompt_ids))

    async def finish(self, output_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """The (prompt, response) chains of the prompt followed by ``output_ids``."""
        prompt = await self._prompt
        tail = len(prompt) * BLOCK_TOKENS
        rest = [*self._prompt_ids[tail:], *output_ids]
        response = await chain(rest, prompt[-1] if prompt else 0)
        return prompt, response

    def cancel(self) -> None:
        if not self._prompt.done():
            self._prompt.cancel()
        else:  # retrieve it, so that an exception is not reported as never retrieved
            with contextlib.suppress(BaseException):
                self._prompt.result()
