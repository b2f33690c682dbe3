"""``schedscope export-tokenizer``: the served model's tokenizer as a Hugging Face
tokenizer.json, for load generators that count tokens locally (docs/serving.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.config import ConfigError
from harness.cli.app import console


def export_tokenizer(
    out_dir: Path = typer.Argument(
        ..., metavar="OUT_DIR", help="Directory to write tokenizer.json (and configs) in."
    ),
    model: str = typer.Option(
        "tiny", "--model", help="Model preset name or checkpoint directory, as given to serve."
    ),
) -> None:
    """Write the served model's tokenizer as a Hugging Face tokenizer.json, so load
    generators that count tokens locally (AIPerf --tokenizer, GuideLLM --processor)
    count exactly what the server counts (docs/serving.md)."""
    from engine.serving.tokenizer import HFTokenizer, export_hf_tokenizer
    from harness.serve.server import tokenizer_for

    try:
        tokenizer = tokenizer_for(model)
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    try:
        path = export_hf_tokenizer(tokenizer, out_dir)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot write {out_dir}: {exc.strerror or exc}", param_hint="OUT_DIR"
        ) from None
    if isinstance(tokenizer, HFTokenizer):
        console.print(f"copied {tokenizer.path} to {path}")
    else:
        console.print(
            f"wrote {path}: word-level, one token per whitespace-separated word, "
            f"as the server's hash tokenizer (vocab {tokenizer.vocab_size}); counts "
            "match the server's, token ids do not"
        )
