"""The context-window rule, one for every service: a request fits when its prompt and its
``max_tokens`` together fit the model's window.  The gateway checks it before scheduling, with the
prompt not yet tokenized; the worker checks it again with the prompt's exact token count."""

from __future__ import annotations

from clairvoyant.core.errors import ContextLengthExceeded


def check_context_window(
    max_model_len: int, max_tokens: int, prompt_tokens: int | None = None, *, param: str
) -> None:
    """Raise ContextLengthExceeded (naming ``param``) unless ``prompt_tokens + max_tokens`` fits
    ``max_model_len``.  ``prompt_tokens`` None: not counted yet, so at least one.  A
    ``max_model_len`` of 0 is unknown: everything fits."""
    counted = 1 if prompt_tokens is None else prompt_tokens
    if not max_model_len or counted + max_tokens <= max_model_len:
        return
    if prompt_tokens is None:
        requested = f"{max_tokens} tokens for the completion, which leaves no room for the prompt"
    else:
        requested = (
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
            "completion)"
        )
    raise ContextLengthExceeded(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested {requested}.",
        param=param,
    )
