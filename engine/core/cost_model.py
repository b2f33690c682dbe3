"""Predicts how long a step takes from what is in it: the simulator's executor time.

A linear model over the batch's features (each a sum the scheduler already
computes while building the step)::

    step_s = step_overhead_s
           + prefill_token_s          * prefill tokens
           + decode_seq_s             * decode sequences
           + decode_context_token_s   * sum of decode context lengths
           + prefill_attention_s      * sum over prefill chunks of chunk_len * context_len
           + swap_block_s             * blocks swapped in or out
           + prefill_seq_s            * prefill chunks (sequences prefilling)
           + mixed_step_s             * (1 if the step mixes prefill and decode)
           + prefill_padded_attention_s * sum over the runner's prefill groups of
                                          chunks * longest chunk * longest context
           + decode_small_batch_seq_s * min(decode sequences, DECODE_SMALL_BATCH)

Linear because each term is a kernel whose cost is linear in that quantity
(weight GEMMs in tokens, attention in context, copies in blocks); the fit of
``schedscope calibrate`` checks how true that is on a device. The parameters load
from JSON; the file also records the device, model and date it was fitted on, and
the fingerprint of the machine (when the harness recorded one).
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

FEATURES = (
    "step_overhead_s",
    "prefill_token_s",
    "decode_seq_s",
    "decode_context_token_s",
    "prefill_attention_s",
    "swap_block_s",
    "prefill_seq_s",
    "mixed_step_s",
    "prefill_padded_attention_s",
    "decode_small_batch_seq_s",
)

#: Up to this many decoding sequences, each costs ``decode_small_batch_seq_s`` on top of
#: ``decode_seq_s``: a decode step's cost is concave in its batch, not linear. Measured on
#: the runner (tiny, 1 thread, 2-core Xeon, 2026-12-02): past the context term, the 3rd
#: to 10th sequence of a batch added 150-190 µs each, the 10th to 72nd 60-75 µs. A line
#: through both priced the 1x default profile's batches of ~4 at the large batches'
#: rate: a quick calibration (mostly ~100-stream decode steps) made the served 1x run's
#: total step time 5-9% short and its E2E p95 15-16% short; with this term (knee 8,
#: chosen from 4-32 on those runs) 0.4-3.7% short (docs/simulator.md).
DECODE_SMALL_BATCH = 8

_SMALL = FEATURES.index("decode_small_batch_seq_s")


def step_features(
    num_prefill_tokens: int,
    num_decode_seqs: int,
    decode_context_tokens: int = 0,
    prefill_attention_work: int = 0,
    num_swap_blocks: int = 0,
    num_prefill_seqs: int | None = None,
    prefill_padded_attention_work: int = 0,
) -> list[float]:
    """The feature vector (in FEATURES order) of a step; all zeros for an empty step."""
    if not (num_prefill_tokens or num_decode_seqs or num_swap_blocks):
        return [0.0] * len(FEATURES)
    if num_prefill_seqs is None:
        num_prefill_seqs = 1 if num_prefill_tokens else 0
    mixed = 1.0 if num_prefill_tokens and num_decode_seqs else 0.0
    return [
        1.0,
        float(num_prefill_tokens),
        float(num_decode_seqs),
        float(decode_context_tokens),
        float(prefill_attention_work),
        float(num_swap_blocks),
        float(num_prefill_seqs),
        mixed,
        float(prefill_padded_attention_work),
        float(min(num_decode_seqs, DECODE_SMALL_BATCH)),
    ]


class CostModelError(ValueError):
    pass


#: The largest value of any parameter (seconds per unit of its feature): a minute per
#: token, sequence or step is beyond any engine, and a bound keeps every step's price
#: finite (1e300 overflowed the simulator's arithmetic).
MAX_PARAMETER_S = 60.0


@dataclass(frozen=True)
class CostModel:
    # Defaults: `schedscope calibrate --from-steps` of six served runs of the default
    # profile under fcfs, three at 0.3x its rate and three at 1x (its 42 req/s burst
    # included), so both the light and the busy regime are in the fit
    # (`benchmarks/bench_serving.py --repeats 3` at each rate; `schedscope serve
    # --executor torch`, the engine process with 1 torch thread of 2 CPU cores, spans and
    # metrics on, tiny, fp32, torch 2.13, 2026-12-01, after grouped prefill attention,
    # freed host memory kept and the start-up warm-up), rounded: a step's full served
    # cycle. Held-out median error 4.0% (p90 10.3%) over 97k steps, 99.5% of held-out
    # total time. With prefill chunks grouped by size, the summed attention term fits
    # and the padded one comes out 0. Those runs never swapped: swap_block_s is the
    # profiling calibration's. See docs/execution.md.
    step_overhead_s: float = 2.06e-3
    prefill_token_s: float = 3.46e-5
    decode_seq_s: float = 1.28e-4
    decode_context_token_s: float = 4.30e-7
    prefill_attention_s: float = 8.30e-8
    swap_block_s: float = 6.7e-6
    prefill_seq_s: float = 1.50e-3
    mixed_step_s: float = 0.0
    prefill_padded_attention_s: float = 0.0
    #: Not fitted for the defaults (they came before the term): 0, so they are linear.
    decode_small_batch_seq_s: float = 0.0
    #: Not a step cost: the time a request and its tokens spend outside the engine on
    #: the way from the client and back (HTTP, the pipe to the engine process and back,
    #: SSE), added to simulated client-side TTFT and E2E. Measured by
    #: benchmarks/bench_serving.py from served runs' client and engine records (median
    #: at 0.3x the default rate, where it matters: 2.4 ms of a ~30 ms TTFT; at 1x the
    #: busier API process makes it ~7.7 ms; 2 cores, 2026-12-01). 0 makes the network
    #: instant.
    client_latency_s: float = 2.4e-3
    device: str = "cpu: x86_64, 2 cores, served with 1 torch thread (built-in defaults)"
    model: str = "tiny"
    fitted_at: str = ""
    source: str = "default"
    fit: dict = field(default_factory=dict)  # calibration statistics, free-form
    #: The machine the fit was made on (the harness's fingerprint: its parts, ``key``
    #: and ``machine_key``), free-form here; empty for the built-in defaults and for
    #: files written before it was recorded. Left out of :meth:`to_dict` when empty, so
    #: such a model's dict (and the summaries that carry it) keep their bytes.
    fingerprint: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (*FEATURES, "client_latency_s"):
            value = getattr(self, name)
            # NaN and inf pass "< 0"; a NaN step cost hung the simulator's clock and an
            # infinite one made every latency null; a bool is not a price.
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not 0 <= value <= MAX_PARAMETER_S
            ):
                raise CostModelError(
                    f"cost model parameter {name} must be a finite number of seconds in "
                    f"[0, {MAX_PARAMETER_S:g}], got {value!r}"
                )
        if not isinstance(self.fingerprint, dict):
            raise CostModelError(
                f"cost model fingerprint must be an object, got {self.fingerprint!r}"
            )

    @classmethod
    def from_coefficients(cls, coefficients: Iterable[float], **other: Any) -> CostModel:
        """A model with ``coefficients`` as its parameters, in FEATURES order (exactly
        one each), and ``other`` as its remaining fields."""
        # Typed by its values' union: mypy checks a ``**`` mapping against every field
        # it may fill, the str and dict ones included, not only the FEATURES it holds.
        params: dict[str, Any] = dict(zip(FEATURES, coefficients, strict=True))
        return cls(**params, **other)

    @classmethod
    def constant(cls, step_s: float) -> CostModel:
        """Every non-empty step takes ``step_s`` (0: as fast as Python goes)."""
        return cls.from_coefficients(
            (step_s if name == "step_overhead_s" else 0.0 for name in FEATURES),
            client_latency_s=0.0,
            source="constant",
        )

    def at_speed(self, time_ratio: float) -> CostModel:
        """This model on a machine whose steps take ``time_ratio`` times its price (1.2:
        a fifth slower): every step cost scaled, the client latency (outside the
        engine's steps) kept. What a machine whose speed wanders does to a simulation."""
        if not (math.isfinite(time_ratio) and time_ratio > 0):
            raise CostModelError(f"time_ratio must be a finite number > 0, got {time_ratio!r}")
        return dataclasses.replace(
            self,
            **{name: getattr(self, name) * time_ratio for name in FEATURES},
            source=f"{self.source} at {time_ratio:.3g}x its step costs",
        )

    @cached_property
    def coefficients(self) -> tuple[float, ...]:
        """The parameters in FEATURES order. Read once per step by the simulator: kept
        as a tuple, computed once (cached in the instance's ``__dict__``, so not a
        dataclass field: neither compared nor saved)."""
        return tuple(float(getattr(self, n)) for n in FEATURES)

    def predict(
        self,
        num_prefill_tokens: int,
        num_decode_seqs: int,
        decode_context_tokens: int = 0,
        prefill_attention_work: int = 0,
        num_swap_blocks: int = 0,
        num_prefill_seqs: int | None = None,
        prefill_padded_attention_work: int = 0,
    ) -> float:
        """Predicted seconds for a step with this content (0 for an empty step)."""
        return self.predict_features(
            step_features(
                num_prefill_tokens,
                num_decode_seqs,
                decode_context_tokens,
                prefill_attention_work,
                num_swap_blocks,
                num_prefill_seqs,
                prefill_padded_attention_work,
            )
        )

    def predict_features(self, features: list[float]) -> float:
        """The model itself — the one place its formula is evaluated."""
        coefficients = self.coefficients
        if len(features) != len(coefficients):
            raise ValueError(f"expected {len(coefficients)} features, got {len(features)}")
        return sum(map(operator.mul, coefficients, features))

    def predict_decode_step(self, num_decode_seqs: int, decode_context_tokens: int) -> float:
        """``predict(0, num_decode_seqs, decode_context_tokens)`` bit for bit (a step of
        decodes only, the simulator's decode runs), without the feature vector: the
        sum's zero terms add exactly nothing to its non-negative partial sums, so the
        same additions in the same order are left."""
        if not num_decode_seqs or not self._finite:
            return self.predict(0, num_decode_seqs, decode_context_tokens)
        c = self.coefficients
        return (
            c[0]
            + c[2] * float(num_decode_seqs)
            + c[3] * float(decode_context_tokens)
            + c[_SMALL] * float(min(num_decode_seqs, DECODE_SMALL_BATCH))
        )

    def decode_step_predictor(self) -> Callable[[int, int], float]:
        """:meth:`predict_decode_step` as a function of its two arguments, its
        coefficients bound (what a decode run calls once per step). Python multiplies a
        float by an int as by ``float(int)`` (the same conversion), so this is
        ``predict_decode_step`` bit for bit."""
        if not self._finite:
            return self.predict_decode_step
        c = self.coefficients
        overhead, per_seq, per_context, small = c[0], c[2], c[3], c[_SMALL]
        knee = DECODE_SMALL_BATCH

        def predict(num_decode_seqs: int, decode_context_tokens: int) -> float:
            if not num_decode_seqs:
                return self.predict(0, 0, decode_context_tokens)
            return (
                overhead
                + per_seq * num_decode_seqs
                + per_context * decode_context_tokens
                + small * (num_decode_seqs if num_decode_seqs < knee else knee)
            )

        return predict

    @cached_property
    def _finite(self) -> bool:
        """Every parameter finite (``inf * 0`` is NaN, which the shortcut would skip)."""
        return all(math.isfinite(c) for c in self.coefficients)

    def predict_step(self, out) -> float:
        """Predicted seconds for a :class:`engine.core.sched.scheduler_output.SchedulerOutput`."""
        num_decode = out.num_decode_seqs
        return self.predict(
            out.num_prefill_tokens,
            num_decode,
            out.num_decode_context_tokens,
            out.prefill_attention_work,
            len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out),
            out.num_prefill_seqs,
            out.prefill_padded_attention_work,
        )

    def predict_swap_s(self, num_blocks: int) -> float:
        """Seconds added to the steps that swap ``num_blocks`` blocks out and, later,
        back in (twice the copy, no step overhead: the copies ride in other steps)."""
        return self.predict(0, 0, num_swap_blocks=2 * num_blocks) - self.step_overhead_s

    def predict_recompute_s(self, num_context_tokens: int) -> float:
        """Seconds added by re-prefilling ``num_context_tokens`` as one prefill chunk
        (no step overhead: the re-prefill rides in a step that runs anyway)."""
        if num_context_tokens <= 0:
            return 0.0
        n = num_context_tokens
        return (
            self.predict(
                n,
                0,
                prefill_attention_work=n * n,
                num_prefill_seqs=1,
                prefill_padded_attention_work=n * n,
            )
            - self.step_overhead_s
        )

    # -- files -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.fingerprint:
            del out["fingerprint"]
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict, origin: str = "cost model") -> CostModel:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CostModelError(
                f"{origin}: unknown keys {unknown}; expected some of {sorted(known)}"
            )
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
