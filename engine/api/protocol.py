"""The OpenAI wire format. Each concept has its own module; this one re-exports them:

- ``engine.api.errors``: :class:`ApiError` (an OpenAI error body) and its builders;
- ``engine.api.json_codec``: a request body parsed into a JSON object, compact dumps;
- ``engine.api.generate_request``: the validated request (:class:`GenerateRequest`);
- ``engine.api.validation``: validation of a completion or chat request body;
- ``engine.api.chat_template``: chat messages and the template that renders them;
- ``engine.api.responses``: response objects and the chunks of a stream;
- ``engine.api.detokenizer``: the incremental detokenizer of a stream.
"""

from engine.api.chat_template import (
    CHAT_ROLES,
    ESCAPED_MARKER_OPEN,
    MAX_MESSAGES,
    ROLE_MARKER_OPEN,
    chat_messages,
    render_chat,
)
from engine.api.detokenizer import IncrementalDetokenizer
from engine.api.errors import ApiError, bad_request, unavailable
from engine.api.generate_request import GenerateRequest, PromptChoice, ServingContext
from engine.api.json_codec import (
    MAX_JSON_DEPTH,
    check_text,
    dumps,
    json_depth,
    json_type,
    parse_json_object,
    show_value,
)
from engine.api.responses import (
    ChoiceResult,
    ChunkWriter,
    chat_response,
    completion_response,
    usage,
)
from engine.api.validation import (
    FLOAT32_MAX,
    GREEDY_TEMPERATURE,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_BATCH_PROMPTS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    UNSUPPORTED_FIELDS,
    check_model,
    parse_generate_request,
)

__all__ = [
    "CHAT_ROLES",
    "ESCAPED_MARKER_OPEN",
    "FLOAT32_MAX",
    "GREEDY_TEMPERATURE",
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_BATCH_PROMPTS",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGES",
    "MAX_STOP_STRINGS",
    "MAX_STOP_TOKEN_IDS",
    "ROLE_MARKER_OPEN",
    "UNSUPPORTED_FIELDS",
    "ApiError",
    "ChoiceResult",
    "ChunkWriter",
    "GenerateRequest",
    "IncrementalDetokenizer",
    "PromptChoice",
    "ServingContext",
    "bad_request",
    "chat_messages",
    "chat_response",
    "check_model",
    "check_text",
    "completion_response",
    "dumps",
    "json_depth",
    "json_type",
    "parse_generate_request",
    "parse_json_object",
    "render_chat",
    "show_value",
    "unavailable",
    "usage",
]
