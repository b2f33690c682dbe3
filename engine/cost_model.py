"""Predicts how long a step takes from what is in it: the simulator's executor time.

A linear model over the batch's features (each a sum the scheduler already
computes while building the step)::

    step_s = step_overhead_s
           + prefill_token_s          * prefill tokens
           + decode_seq_s             * decode sequences
           + decode_context_token_s   * sum of decode context lengths
           + prefill_attention_s      * sum over prefill chunks of chunk_len * context_len
           + swap_block_s             * blocks swapped in or out

Linear because each term is a kernel whose cost is linear in that quantity
(weight GEMMs in tokens, attention in context, copies in blocks); the fit of
``schedscope calibrate`` checks how true that is on a device. The parameters load
from JSON; the file also records the device, model and date it was fitted on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

FEATURES = (
    "step_overhead_s",
    "prefill_token_s",
    "decode_seq_s",
    "decode_context_token_s",
    "prefill_attention_s",
    "swap_block_s",
)


class CostModelError(ValueError):
    pass


@dataclass(frozen=True)
class CostModel:
    # Defaults: rough figures for the bundled ``tiny`` model on 2 CPU cores (fp32):
    # ~0.45 ms fixed per step, ~0.1 ms per decode sequence, ~20k prefill tokens/s,
    # ~4 KB of K/V read per context token per step, a 64 KiB block copy ~10 us.
    step_overhead_s: float = 4.5e-4
    prefill_token_s: float = 5.0e-5
    decode_seq_s: float = 1.0e-4
    decode_context_token_s: float = 4.0e-7
    prefill_attention_s: float = 5.0e-8
    swap_block_s: float = 1.0e-5
    device: str = "cpu (uncalibrated defaults)"
    model: str = "tiny"
    fitted_at: str = ""
    source: str = "default"
    fit: dict = field(default_factory=dict)  # calibration statistics, free-form

    def __post_init__(self) -> None:
        for name in FEATURES:
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise CostModelError(f"cost model parameter {name} must be a number >= 0, got {value!r}")

    def predict(
        self,
        num_prefill_tokens: int,
        num_decode_seqs: int,
        decode_context_tokens: int = 0,
        prefill_attention_work: int = 0,
        num_swap_blocks: int = 0,
    ) -> float:
        """Predicted seconds for a step with this content (0 for an empty step)."""
        if not (num_prefill_tokens or num_decode_seqs or num_swap_blocks):
            return 0.0
        return (
            self.step_overhead_s
            + self.prefill_token_s * num_prefill_tokens
            + self.decode_seq_s * num_decode_seqs
            + self.decode_context_token_s * decode_context_tokens
            + self.prefill_attention_s * prefill_attention_work
            + self.swap_block_s * num_swap_blocks
        )

    def predict_step(self, out) -> float:
        """Predicted seconds for a :class:`engine.scheduler.SchedulerOutput`."""
        return self.predict(
            out.num_prefill_tokens,
            out.num_decode_seqs,
            out.num_decode_context_tokens,
            out.prefill_attention_work,
            len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out),
        )

    # -- files -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict, origin: str = "cost model") -> CostModel:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CostModelError(f"{origin}: unknown keys {unknown}; expected some of {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise CostModelError(f"{origin}: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise CostModelError(f"cost model file not found: {path}") from None
        except json.JSONDecodeError as exc:
            raise CostModelError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise CostModelError(f"{path}: expected a JSON object of parameters")
        return cls.from_dict(data, origin=str(path))
