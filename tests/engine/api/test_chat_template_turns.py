"""The bundled engine's chat template keeps a conversation's turn k prompt a prefix of
turn k + 1's, token for token, with the answer the client received sent back as text:
what lets a session's later turns hit the prefix cache (docs/profiles.md, "Sessions")."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.api.chat_template import render_chat
from engine.serving.tokenizer import EOS_TOKEN_ID, NUM_SPECIAL_TOKENS, HashTokenizer

VOCAB = 1280
tokenizer = HashTokenizer(VOCAB)
words = st.lists(
    st.sampled_from(["the", "of", "and", "zephyr", "w12", "<|user|>", "x"]), max_size=12
)
generated = st.lists(st.integers(NUM_SPECIAL_TOKENS, VOCAB - 1), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(
    system=st.one_of(st.none(), words),
    turns=st.lists(st.tuples(words, generated), min_size=1, max_size=5),
)
def test_turn_k_prompt_is_a_prefix_of_turn_k_plus_1_and_holds_the_answer(system, turns):
    messages = [] if system is None else [("system", " ".join(system))]
    previous: list[int] | None = None
    answer_ids: list[int] | None = None
    for user, answer in turns:
        messages.append(("user", " ".join(user)))
        prompt = tokenizer.encode(render_chat(messages))
        if previous is not None:
            assert prompt[: len(previous)] == previous
            # the answer's text, encoded again, is the ids the model generated
            assert prompt[len(previous) : len(previous) + len(answer_ids)] == answer_ids
        previous, answer_ids = prompt, answer
        text = tokenizer.decode(answer)  # what the client received, streamed
        messages.append(("assistant", text))


def hashed(word: str) -> int:
    digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
    return NUM_SPECIAL_TOKENS + int.from_bytes(digest, "little") % (VOCAB - NUM_SPECIAL_TOKENS)


def test_a_decoded_pseudo_word_encodes_to_its_id_and_other_words_hash():
    ids = [3, 17, VOCAB - 1]
    assert tokenizer.encode(tokenizer.decode(ids)) == ids
    assert tokenizer.decode([EOS_TOKEN_ID]) == ""  # special ids are not text
    # not a decoded id of this vocabulary (a special id, a leading zero, past the end,
    # not digits): hashed as any word
    for word in ("w0", "w2", "w017", f"w{VOCAB}", "w", "wx1", "w-3", "the"):
        assert tokenizer.token_id(word) == hashed(word), word
