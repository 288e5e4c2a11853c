"""ByteTokenizer round trips and chat templates rendered the way transformers renders them."""

from __future__ import annotations

from datetime import datetime

import pytest

from clairvoyant.worker.runners.base import Tokenizer
from clairvoyant.worker.runners.tiny_random import TINY_SPECIAL_TOKENS
from clairvoyant.worker.runners.tokenizer import ByteTokenizer, ChatTemplate, ChatTemplateError

pytestmark = pytest.mark.unit

BOS, EOS, IM_START, IM_END = 256, 257, 258, 259


def byte_tokenizer() -> ByteTokenizer:
    return ByteTokenizer(TINY_SPECIAL_TOKENS)


@pytest.mark.parametrize("text", ["", "hello", "héllo wörld — 日本語 🙂", "tab\tnew\nline\x00nul"])
def test_byte_round_trip_including_multibyte_utf8(text: str) -> None:
    tokenizer = byte_tokenizer()
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_byte_ids_of_multibyte_characters() -> None:
    assert byte_tokenizer().encode("é🙂") == [0xC3, 0xA9, 0xF0, 0x9F, 0x99, 0x82]


def test_special_tokens_encode_whole_and_decode_to_nothing() -> None:
    tokenizer = byte_tokenizer()
    assert tokenizer.vocab_size == 260
    assert tokenizer.encode("<|im_start|>hi<|im_end|><eos>") == [IM_START, 104, 105, IM_END, EOS]
    assert tokenizer.decode([BOS, 104, 105, IM_END]) == "hi"
    # A partial multibyte sequence (as a stream cut mid-character) decodes to U+FFFD, never raises.
    assert tokenizer.decode([0xE6, 0x97]) == "\ufffd"


def test_chatml_template_for_a_two_message_chat() -> None:
    tokenizer = byte_tokenizer()
    assert isinstance(tokenizer, Tokenizer)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    rendered = tokenizer.chat_template.render(chat)
    assert (
        rendered
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    expected = [IM_START, *b"system\nBe brief.", IM_END, *b"\n", IM_START, *b"user\nHi!", IM_END, *b"\n"] + [
        IM_START,
        *b"assistant\n",
    ]
    assert tokenizer.apply_chat_template(chat) == expected
    assert (
        tokenizer.apply_chat_template(chat, add_generation_prompt=False)
        == expected[: -len(b"assistant\n") - 1]
    )


def test_template_helpers_match_transformers_environment() -> None:
    source = (
        "{% for m in messages %}\n"  # trim_blocks eats this newline
        "    {% if m['role'] == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"  # lstrip_blocks
        "{{ bos_token }}{{ m | tojson }}{{ strftime_now('%Y-%m-%d') }}\n"
        "{% endfor %}"
    )
    template = ChatTemplate(source, {"bos_token": "<s>"}, now=lambda: datetime(2025, 1, 2))
    assert (
        template.render([{"role": "user", "content": "ü"}])
        == '<s>{"role": "user", "content": "ü"}2025-01-02\n'
    )
    with pytest.raises(ChatTemplateError, match="no bad roles"):
        template.render([{"role": "bad", "content": ""}])
