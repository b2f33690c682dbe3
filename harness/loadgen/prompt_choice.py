"""Which prompts a run sends: ``--prompt-mode token_ids | text | auto``.

Token-id prompts are exact on any server, but only with ids inside the server's
vocabulary: vLLM refuses a prompt with an id at or above its tokenizer's size
(``Token id 2032 is out of vocabulary``). ``auto`` learns where the vocabulary ends
before the run starts (:func:`choose`):

1. ``POST /tokenize`` a probe text (common and rare words, digits, accented and CJK
   characters): every id it returns is in the vocabulary, so the largest + 1 is a
   lower bound of its size (``vocab_bound``). At or above the default id range's end
   (3000), the default ids ``[1000, 3000)`` are used.
2. Else one 1-token request with the default range's first and last ids (a common-word
   probe of a large vocabulary may stay below 3000): accepted, the default ids are
   used.
3. Refused: ids in ``[vocab_bound // 4, vocab_bound)`` when that span holds at least
   :data:`MIN_ID_SPAN` ids (requests then still share no prefix), else text prompts,
   sized with ``/tokenize`` (``estimate``, one token per word, without it).

The choice (``mode``, ``reason``, ``vocab_bound``, ``id_range``, the model's
``max_model_len`` from ``/v1/models``) goes into each process's summary as
``prompts``, then into the cell's run.json and the report. Stdlib only (gevent-safe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from harness.loadgen.prompts import DEFAULT_ID_RANGE, WORDS

#: Fewer ids than this below the vocabulary bound: text prompts instead of token ids.
MIN_ID_SPAN = 256
#: What /tokenize is asked for: ids from all over a vocabulary, rare ones included.
PROBE_TEXT = " ".join(
    [
        *WORDS,
        "zephyr quixotic xylophone juxtapose kaleidoscope onomatopoeia serendipity",
        "mnemonic rhythm sphinx fjord czar pneumatic bureaucracy idiosyncrasy",
        "1234567890 3.14159 0xDEADBEEF #%&*@ ~^`|<> naïve café résumé Ångström façade",
        "東京 北京 日本語 中文 한국어 русский ελληνικά العربية हिन्दी ไทย emoji 🙂🚀",
    ]
)


@dataclass(frozen=True)
class PromptChoice:
    requested: str  # --prompt-mode: token_ids | text | auto
    mode: str  # what is sent: token_ids | text
    reason: str
    #: ids below this are in the vocabulary (the largest id /tokenize returned + 1)
    vocab_bound: int | None = None
    #: token ids sent: [lo, hi) (token_ids mode only)
    id_range: tuple[int, int] | None = None
    max_model_len: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["id_range"] = list(self.id_range) if self.id_range else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PromptChoice:
        """Read back :meth:`to_dict` (a summary's or run.json's ``prompts``)."""
        names = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in d.items() if k in names}
        if values.get("id_range"):
            values["id_range"] = tuple(values["id_range"])
        return cls(**values)

    def line(self) -> str:
        """``token_ids in [1000, 3000) (auto: ...)``: the report's "prompts:" line."""
        what = (
            f"token ids in [{self.id_range[0]}, {self.id_range[1]})"
            if self.mode == "token_ids" and self.id_range
            else self.mode
        )
        return f"{what} ({self.requested}: {self.reason})"


def choose(
    requested: str,
    endpoint: str,
    tokenize_ids: Callable[[str], list[int] | None],
    accepts: Callable[[list[int]], tuple[bool, str]],
    max_model_len: int | None = None,
) -> PromptChoice:
    """The prompts to send. ``tokenize_ids(text)``: the ids the server's /tokenize gives
    (None: it has none). ``accepts(ids)``: (whether a 1-token request with these prompt
    ids succeeded, the server's message when not); only ``auto`` calls either."""
    lo, hi = DEFAULT_ID_RANGE
    if endpoint == "chat":
        return PromptChoice(requested, "text", "chat prompts are text", None, None, max_model_len)
    if requested == "token_ids":
        return PromptChoice(requested, "token_ids", "as asked", None, (lo, hi), max_model_len)
    if requested == "text":
        return PromptChoice(requested, "text", "as asked", None, None, max_model_len)
    if requested != "auto":
        raise ValueError(f"--prompt-mode {requested!r}: expected token_ids, text or auto")
    ids = tokenize_ids(PROBE_TEXT)
    bound = max(ids) + 1 if ids else None
    if bound is not None and bound >= hi:
        return PromptChoice(
            requested,
            "token_ids",
            f"/tokenize returned ids up to {bound - 1}, so the default ids are in the vocabulary",
            bound,
            (lo, hi),
            max_model_len,
        )
    ok, message = accepts([lo, hi - 1])
    if ok:
        return PromptChoice(
            requested,
            "token_ids",
            f"the server accepted ids {lo} and {hi - 1} (a 1-token probe request)",
            bound,
            (lo, hi),
            max_model_len,
        )
    refused = f"the server refused ids {lo} and {hi - 1} ({message})"
    if bound is not None and bound - bound // 4 >= MIN_ID_SPAN:
        return PromptChoice(
            requested,
            "token_ids",
            f"{refused}; /tokenize returned ids up to {bound - 1}: ids below {bound} only",
            bound,
            (bound // 4, bound),
            max_model_len,
        )
    if bound is not None:
        why = f"{refused}; /tokenize returned ids below {bound} only: too few for token-id prompts"
        return PromptChoice(
            requested, "text", why + ", text sized with /tokenize", bound, None, max_model_len
        )
    return PromptChoice(
        requested,
        "text",
        f"{refused}; no /tokenize ids: text, one token per word (estimate)",
        None,
        None,
        max_model_len,
    )
