"""The chat conversation: a chat request's ``messages`` read into (role, text) pairs, and
the chat template that renders them as the prompt's text."""

from __future__ import annotations

from engine.api.errors import bad_request
from engine.api.json_codec import check_text, json_type, show_value

MAX_MESSAGES = 4096
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")

#: The opening of a role marker. In message content it is escaped (as ``<\|``), so no
#: content can produce the tokens of a marker — a user message cannot pose as a system
#: message, whatever it contains.
ROLE_MARKER_OPEN = "<|"
ESCAPED_MARKER_OPEN = "<\\|"


def render_chat(messages: list[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """The chat template: one ``<|role|> content`` line per message, then the assistant
    cue ``<|assistant|>`` on its own line (unless ``add_generation_prompt`` is false).
    ``<|`` inside content becomes ``<\\|`` (a backslash between the two characters)."""
    lines = [
        f"<|{role}|> {content.replace(ROLE_MARKER_OPEN, ESCAPED_MARKER_OPEN)}"
        for role, content in messages
    ]
    if add_generation_prompt:
        lines.append("<|assistant|>")
    return "\n".join(lines)


def chat_messages(body: dict) -> list[tuple[str, str]]:
    if "messages" not in body or body["messages"] is None:
        raise bad_request("missing required field: messages", "messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad_request(f"messages must be an array, got {json_type(messages)}", "messages")
    if not messages:
        raise bad_request("messages must not be empty", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"messages may hold at most {MAX_MESSAGES} entries", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object, got {json_type(message)}", "messages")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(
                f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {show_value(role)}",
                "messages",
            )
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = check_text(content, "messages")
        elif isinstance(content, list):
            parts = []
            for part in content:
                if not (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    raise bad_request(
                        f"{where}.content: only text parts "
                        '({"type": "text", "text": "..."}) are supported',
                        "messages",
                    )
                parts.append(check_text(part["text"], "messages"))
            text = "\n".join(parts)
        else:
            raise bad_request(
                f"{where}.content must be a string, an array of text parts or "
                f"null, got {json_type(content)}",
                "messages",
            )
        out.append((role, text))
    return out
