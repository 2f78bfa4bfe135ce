"""Mixture plans: which source, epoch and sequence every global training sample comes from.

A :class:`MixSpec` says how to mix sources: explicit weights, or temperature sampling over
token counts (weight of source i proportional to ``n_i ** (1 / T)``), a cap on epochs per
source, an optional schedule of phases (a curriculum: token boundaries, each phase with its
own weights) and a seed. :func:`resolve_mix` resolves it against the real per-source counts
of ``shards/manifest.json`` into a :class:`MixPlan`, the content of ``mix.json``, and
:meth:`MixPlan.locate` is the blend the training loader executes.

Units. A sample is one sequence of ``seq_len + 1`` tokens and counts as ``seq_len`` training
tokens, so token amounts convert to samples by ``tokens // seq_len``. Positions are global
sample indices ``0 .. total_samples - 1``; they do not depend on the world size.

Blend (``position -> source``). Each phase's weights are quantised to integer counts
``c_i`` per block of ``BLOCK_SIZE`` positions (largest remainder, so they sum exactly to
the block). Inside the block, copy ``j`` of source ``i`` sits at its ideal time
``(j + 1/2) / c_i`` and the block is those copies sorted by time (ties by source index):
a fixed, low-discrepancy interleaving computed once per phase. Position ``p`` of a phase is
``pattern[p % BLOCK_SIZE]``, and how many samples of that source came before it is
``(p // BLOCK_SIZE) * c_i + j`` plus the source's samples in earlier phases: O(1) per
position, no state carried between positions. Guarantee (tested over every window): in any
window of ``N`` consecutive positions inside one phase, each source's share differs from its
target weight by at most :meth:`MixPlan.window_tolerance` = ``(S + 3) / N + 1 / BLOCK_SIZE``
for ``S`` sources.

Epochs and order inside a source. The ``k``-th sample drawn from source ``i`` is epoch
``k // sequences_i``; inside an epoch the source is read in the order of a permutation that
is a pure function of (seed, source name, epoch). The permutation is a 4-round Feistel
network over the smallest ``4**h >= sequences_i`` with cycle walking back into range, so it
needs no memory and costs O(1) expected per position however large the source (a seeded
``numpy`` permutation would materialise ``sequences_i`` integers per epoch in every worker).
Keying by source *name* keeps a source's order unchanged when other sources are added.

Totals and caps. The training budget is, in order of precedence: the ``total_tokens``
argument of :func:`resolve_mix` (the trainer's budget), ``MixSpec.total_tokens``, the
``until_tokens`` of the last phase, and otherwise one natural pass (the used sources'
sequences together), shortened where needed so no source exceeds its epoch cap. An explicit
budget that would need more epochs of a source than its cap is an error, not a silent cut.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

PLAN_VERSION = 1
BLOCK_SIZE = 1 << 16
"""Positions per blend block; weights are quantised to multiples of ``1 / BLOCK_SIZE``."""
DEFAULT_MAX_EPOCHS = 4.0
"""Repeating data up to about 4 epochs costs little against fresh data (Muennighoff et al.
2023, "Scaling Data-Constrained Language Models"); more than that, returns fall fast."""
_WEIGHT_SUM_TOLERANCE = 1e-6
_FEISTEL_ROUNDS = 4
_MASK64 = (1 << 64) - 1


class MixSpecError(ValueError):
    """A mixture spec that cannot be resolved; the message names the problem in one sentence."""


class MixPhase(BaseModel):
    """One phase of a curriculum: the mixture used until ``until_tokens`` training tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    until_tokens: int | None = Field(
        default=None, gt=0, description="end of the phase in training tokens; None on the last: to the end"
    )
    weights: dict[str, float] | None = Field(default=None, description="explicit weights summing to 1")
    temperature: float | None = Field(default=None, description="weights proportional to tokens^(1/T)")


class MixSpec(BaseModel):
    """How to mix sources. With neither weights, temperature nor phases: temperature 1
    (each source in proportion to its tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights: dict[str, float] | None = Field(
        default=None, description="explicit per-source weights; they must sum to 1 and name every source"
    )
    temperature: float | None = Field(default=None, description="weight_i proportional to tokens_i^(1/T)")
    max_epochs: float = Field(default=DEFAULT_MAX_EPOCHS, description="cap on epochs of any source")
    max_epochs_per_source: dict[str, float] = Field(
        default_factory=dict, description="per-source caps overriding max_epochs"
    )
    phases: list[MixPhase] = Field(default_factory=list, description="optional curriculum, in order")
    total_tokens: int | None = Field(default=None, gt=0, description="training budget in tokens")
    seed: int = Field(default=0, ge=0, description="seeds every per-source, per-epoch permutation")

    @model_validator(mode="after")
    def _check_static(self) -> MixSpec:
        """Problems visible without the manifest; each raises one sentence."""
        if self.phases and (self.weights is not None or self.temperature is not None):
            raise MixSpecError(
                "give weights or a temperature either at the top level or in each phase, not both"
            )
        if self.weights is not None and self.temperature is not None:
            raise MixSpecError("give either explicit weights or a temperature, not both")
        _check_weights_and_temperature(self.weights, self.temperature, "the spec")
        for k, phase in enumerate(self.phases, start=1):
            if (phase.weights is None) == (phase.temperature is None):
                raise MixSpecError(f"phase {k} must give exactly one of weights or temperature")
            _check_weights_and_temperature(phase.weights, phase.temperature, f"phase {k}")
            if phase.until_tokens is None and k < len(self.phases):
                raise MixSpecError(f"phase {k} has no until_tokens; only the last phase may run to the end")
        ends = [p.until_tokens for p in self.phases if p.until_tokens is not None]
        for k in range(1, len(ends)):
            if ends[k] <= ends[k - 1]:
                raise MixSpecError(
                    f"phase boundaries are out of order: phase {k + 1} ends at {ends[k]} tokens, "
                    f"not after phase {k}'s {ends[k - 1]}"
                )
        for name, cap in {"max_epochs": self.max_epochs, **self.max_epochs_per_source}.items():
            if not (math.isfinite(cap) and cap > 0):
                raise MixSpecError(f"epoch cap of {name!r} is {cap}; it must be a positive number")
        return self


def _check_weights_and_temperature(
    weights: dict[str, float] | None, temperature: float | None, where: str
) -> None:
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        raise MixSpecError(f"temperature in {where} is {temperature}; it must be a positive number")
    if weights is None:
        return
    if not weights:
        raise MixSpecError(f"weights in {where} are empty; name every source with its weight")
    for name, w in weights.items():
        if not math.isfinite(w) or w < 0:
            raise MixSpecError(f"weight of source {name!r} in {where} is {w}; weights must be >= 0")
    total = math.fsum(weights.values())
    if abs(total - 1.0) > _WEIGHT_SUM_TOLERANCE:
        raise MixSpecError(f"weights in {where} sum to {total:.6g}, not 1")


class PlanPhase(BaseModel):
    """A resolved phase: positions ``[start, stop)``, target weights and their block counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: int
    stop: int
    weights: tuple[float, ...]
    block_counts: tuple[int, ...]


class MixPlan(BaseModel):
    """``mix.json``: a mixture resolved against real counts; per-source lists follow ``source_names``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = PLAN_VERSION
    seq_len: int
    seed: int
    block_size: int = BLOCK_SIZE
    source_names: tuple[str, ...]
    source_sequences: tuple[int, ...]
    source_tokens: tuple[int, ...]
    max_epochs: tuple[float, ...]
    phases: tuple[PlanPhase, ...]
    samples: tuple[int, ...]
    token_budgets: tuple[int, ...]
    epochs: tuple[float, ...]
    total_samples: int
    total_tokens: int
    spec: dict[str, Any]

    def to_json(self) -> str:
        """Canonical JSON (sorted keys): the bytes of ``mix.json``."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> MixPlan:
        return cls.model_validate_json(text)

    def sha256(self) -> str:
        """sha256 of :meth:`to_json`, so it equals the sha256 of the ``mix.json`` file."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def window_tolerance(self, window: int) -> float:
        """Largest deviation of any source's share from its target in ``window`` consecutive
        positions of one phase (see the module docstring)."""
        return (len(self.source_names) + 3) / window + 1 / self.block_size

    def locate(self, positions: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global sample positions -> (source index, epoch of that source, sequence index in it)."""
        pos = np.atleast_1d(np.asarray(positions, dtype=np.int64))
        if pos.size and (pos.min() < 0 or pos.max() >= self.total_samples):
            bad = int(pos.min()) if pos.min() < 0 else int(pos.max())
            raise IndexError(f"position {bad} is outside this mix plan's {self.total_samples} samples")
        source = np.zeros(pos.shape, np.int64)
        draw = np.zeros(pos.shape, np.int64)  # how many samples of that source came before
        phase_of = np.searchsorted(self._phase_stops, pos, side="right")
        for k in np.unique(phase_of):
            phase, (pattern, copy_index, counts) = self.phases[k], self._patterns[k]
            at = phase_of == k
            offset = pos[at] - phase.start
            slot = offset % self.block_size
            src = pattern[slot]
            source[at] = src
            draw[at] = (
                self._samples_before_phase[k][src]
                + (offset // self.block_size) * counts[src]
                + copy_index[slot]
            )
        sequences = np.asarray(self.source_sequences, np.int64)[source]
        epoch = draw // sequences
        index = _feistel_permute(draw % sequences, sequences, self._epoch_keys(source, epoch))
        return source, epoch, index

    def counts(self, stop: int) -> np.ndarray:
        """Samples of each source among positions ``[0, stop)``."""
        if not 0 <= stop <= self.total_samples:
            raise IndexError(f"stop {stop} is outside this mix plan's {self.total_samples} samples")
        total = np.zeros(len(self.source_names), np.int64)
        for phase, (pattern, _, counts) in zip(self.phases, self._patterns, strict=True):
            if stop <= phase.start:
                break
            total += _phase_counts(min(stop, phase.stop) - phase.start, pattern, counts, self.block_size)
        return total

    @cached_property
    def _patterns(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [_block_pattern(np.asarray(p.block_counts, np.int64)) for p in self.phases]

    @cached_property
    def _phase_stops(self) -> np.ndarray:
        return np.asarray([p.stop for p in self.phases], np.int64)

    @cached_property
    def _samples_before_phase(self) -> list[np.ndarray]:
        before, total = [], np.zeros(len(self.source_names), np.int64)
        for phase, (pattern, _, counts) in zip(self.phases, self._patterns, strict=True):
            before.append(total.copy())
            total += _phase_counts(phase.stop - phase.start, pattern, counts, self.block_size)
        return before

    @cached_property
    def _source_keys(self) -> np.ndarray:
        return np.asarray([_source_key(self.seed, name) for name in self.source_names], np.uint64)

    def _epoch_keys(self, source: np.ndarray, epoch: np.ndarray) -> np.ndarray:
        return _splitmix64(self._source_keys[source] ^ _splitmix64(epoch.astype(np.uint64)))


def resolve_mix(
    spec: MixSpec,
    manifest_sources: Mapping[str, Mapping[str, int]],
    seq_len: int,
    total_tokens: int | None = None,
) -> MixPlan:
    """Resolve ``spec`` against ``{source: {"sequences": n, "tokens": n}}`` (the manifest's
    ``sources``); raises :class:`MixSpecError` naming the problem."""
    if seq_len <= 0:
        raise MixSpecError(f"seq_len is {seq_len}; it must be positive")
    if not manifest_sources:
        raise MixSpecError("the manifest lists no sources to mix")
    names = sorted(manifest_sources)
    sequences = np.asarray([int(manifest_sources[n]["sequences"]) for n in names], np.int64)
    tokens = np.asarray([int(manifest_sources[n]["tokens"]) for n in names], np.int64)
    _check_names(spec, names)
    caps = np.asarray([spec.max_epochs_per_source.get(n, spec.max_epochs) for n in names])
    cap_samples = np.floor(caps * sequences + 1e-9).astype(np.int64)

    if spec.phases:
        phase_specs = spec.phases
    elif spec.weights is None and spec.temperature is None:
        phase_specs = [MixPhase(temperature=1.0)]
    else:
        phase_specs = [MixPhase(weights=spec.weights, temperature=spec.temperature)]
    weights = [_phase_weights(p, names, tokens, k) for k, p in enumerate(phase_specs, start=1)]
    for k, w in enumerate(weights, start=1):
        for i in np.flatnonzero((w > 0) & (sequences == 0)):
            raise MixSpecError(
                f"source {names[i]!r} has weight in phase {k} but no sequences in the manifest"
            )
    block_counts = [_quantise(w, names, k) for k, w in enumerate(weights, start=1)]
    patterns = [_block_pattern(c)[0] for c in block_counts]

    budget = total_tokens if total_tokens is not None else spec.total_tokens
    if budget is None and phase_specs[-1].until_tokens is not None:
        budget = phase_specs[-1].until_tokens
    bounds = [p.until_tokens // seq_len for p in phase_specs[:-1]]  # type: ignore[operator]
    for k in range(1, len(bounds)):
        if bounds[k] <= bounds[k - 1]:
            raise MixSpecError(f"phases {k} and {k + 1} end in the same sample at seq_len {seq_len}")
    fixed = np.zeros(len(names), np.int64)
    start = 0
    for stop, pattern, counts in zip(bounds, patterns, block_counts, strict=False):
        fixed += _phase_counts(stop - start, pattern, counts, BLOCK_SIZE)
        start = stop
    if bounds and bounds[0] == 0:
        raise MixSpecError(f"phase 1 ends at {phase_specs[0].until_tokens} tokens, less than one sample")

    if budget is None:
        total_samples = start + _longest_last_phase(
            start, fixed, patterns[-1], block_counts[-1], cap_samples, names, weights, sequences
        )
    else:
        total_samples = budget // seq_len
        last_end = phase_specs[-1].until_tokens
        if last_end is not None and last_end // seq_len != total_samples:
            raise MixSpecError(
                f"the last phase ends at {last_end} tokens but the training budget is {budget} tokens"
            )
        if total_samples <= start:
            raise MixSpecError(
                f"the training budget of {budget} tokens ends before the last phase starts "
                f"({start * seq_len} tokens)"
            )
    samples = fixed + _phase_counts(total_samples - start, patterns[-1], block_counts[-1], BLOCK_SIZE)
    for i in np.flatnonzero(samples > cap_samples):
        raise MixSpecError(
            f"source {names[i]!r} would need {samples[i] / sequences[i]:.2f} epochs ({samples[i]} samples "
            f"of its {sequences[i]} sequences) for {total_samples * seq_len} training tokens, above its cap of "
            f"{caps[i]:g}; lower the budget or its weight, or raise max_epochs"
        )

    starts = [0, *bounds]
    stops = [*bounds, total_samples]
    return MixPlan(
        seq_len=seq_len,
        seed=spec.seed,
        source_names=tuple(names),
        source_sequences=tuple(int(s) for s in sequences),
        source_tokens=tuple(int(t) for t in tokens),
        max_epochs=tuple(float(c) for c in caps),
        phases=tuple(
            PlanPhase(
                start=a, stop=b, weights=tuple(float(x) for x in w), block_counts=tuple(int(x) for x in c)
            )
            for a, b, w, c in zip(starts, stops, weights, block_counts, strict=True)
        ),
        samples=tuple(int(s) for s in samples),
        token_budgets=tuple(int(s) * seq_len for s in samples),
        epochs=tuple(float(s / q) if q else 0.0 for s, q in zip(samples, sequences, strict=True)),
        total_samples=int(total_samples),
        total_tokens=int(total_samples) * seq_len,
        spec=spec.model_dump(mode="json"),
    )


def _check_names(spec: MixSpec, names: list[str]) -> None:
    known = set(names)
    named = [("max_epochs_per_source", spec.max_epochs_per_source)]
    if spec.weights is not None:
        named.append(("weights", spec.weights))
    named += [(f"phase {k} weights", p.weights) for k, p in enumerate(spec.phases, start=1) if p.weights]
    for where, mapping in named:
        for name in mapping:
            if name not in known:
                raise MixSpecError(
                    f"{where} name source {name!r}, which is not in the manifest (sources: {', '.join(names)})"
                )
    for where, mapping in named[1:]:
        for name in names:
            if name not in mapping:
                raise MixSpecError(f"{where} do not name source {name!r}; give it a weight (0 leaves it out)")


def _phase_weights(phase: MixPhase, names: list[str], tokens: np.ndarray, k: int) -> np.ndarray:
    if phase.weights is not None:
        return np.asarray([phase.weights[n] for n in names], np.float64)
    if tokens.sum() <= 0:
        raise MixSpecError(f"phase {k} uses a temperature but the manifest's sources hold no tokens")
    scaled = np.where(tokens > 0, tokens.astype(np.float64) ** (1.0 / phase.temperature), 0.0)
    return scaled / scaled.sum()


def _quantise(weights: np.ndarray, names: list[str], k: int) -> np.ndarray:
    """Largest-remainder counts per block, summing exactly to BLOCK_SIZE (ties: lower index)."""
    ideal = weights / weights.sum() * BLOCK_SIZE
    counts = np.floor(ideal).astype(np.int64)
    order = np.lexsort((np.arange(len(ideal)), -(ideal - counts)))
    counts[order[: BLOCK_SIZE - counts.sum()]] += 1
    for i in np.flatnonzero((weights > 0) & (counts == 0)):
        raise MixSpecError(
            f"weight {weights[i]:.3g} of source {names[i]!r} in phase {k} is below the blend's resolution "
            f"of 1/{BLOCK_SIZE}; raise it or set it to 0"
        )
    return counts


def _block_pattern(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source per slot, copy index of that source per slot, counts) for one block."""
    source = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    copy_index = np.concatenate([np.arange(c, dtype=np.int64) for c in counts])
    ideal_time = (copy_index + 0.5) / counts[source]
    order = np.lexsort((source, ideal_time))
    return source[order], copy_index[order], counts


def _phase_counts(length: int, pattern: np.ndarray, counts: np.ndarray, block: int) -> np.ndarray:
    """Samples of each source in the first ``length`` positions of a phase."""
    full, rest = divmod(int(length), block)
    return full * counts + np.bincount(pattern[:rest], minlength=len(counts))


def _longest_last_phase(
    start: int,
    fixed: np.ndarray,
    pattern: np.ndarray,
    counts: np.ndarray,
    cap_samples: np.ndarray,
    names: list[str],
    weights: list[np.ndarray],
    sequences: np.ndarray,
) -> int:
    """Length of the open last phase: one natural pass in all, shortened to respect every cap."""
    used = np.zeros(len(names), bool)
    for w in weights:
        used |= w > 0
    natural = int(sequences[used].sum()) - start
    if natural <= 0:
        raise MixSpecError(
            "the phases before the last already cover one pass over the data; give total_tokens "
            "to say how long the last phase runs"
        )

    def fits(length: int) -> bool:
        return bool(np.all(fixed + _phase_counts(length, pattern, counts, BLOCK_SIZE) <= cap_samples))

    if not fits(0):
        i = int(np.flatnonzero(fixed > cap_samples)[0])
        raise MixSpecError(f"the fixed phases alone exceed the epoch cap of source {names[i]!r}")
    low, high = 0, natural  # fits(low) holds; find the largest length that fits
    if fits(high):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    if low == 0:
        raise MixSpecError("the epoch caps leave no samples for the last phase; raise max_epochs")
    return low


def _source_key(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"tokenlake-mix\0{seed}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a fast, well-mixed 64-bit bijection (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _feistel_permute(index: np.ndarray, size: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Element ``index`` of the keyed permutation of ``range(size)``, elementwise.

    A balanced Feistel network over ``2h`` bits (``4**h >= size``) is a bijection of
    ``range(4**h)``; re-applying it until the value falls below ``size`` (cycle walking)
    restricts it to a bijection of ``range(size)``. Expected walks: under 4 since ``4**h < 4 * size``.
    """
    index = index.astype(np.uint64)
    size = size.astype(np.uint64)
    half_bits = np.maximum(1, np.ceil(np.log2(np.maximum(size, 2)) / 2)).astype(np.uint64)
    mask = (np.uint64(1) << half_bits) - np.uint64(1)
    out = _feistel(index, half_bits, mask, keys)
    pending = np.flatnonzero(out >= size)
    while pending.size:
        out[pending] = _feistel(out[pending], half_bits[pending], mask[pending], keys[pending])
        pending = pending[out[pending] >= size[pending]]
    return out.astype(np.int64)


def _feistel(x: np.ndarray, half_bits: np.ndarray, mask: np.ndarray, keys: np.ndarray) -> np.ndarray:
    left, right = x >> half_bits, x & mask
    for r in range(_FEISTEL_ROUNDS):
        round_key = _splitmix64(keys + np.uint64((r + 1) * 0x632BE59BD9B4E019 & _MASK64))
        left, right = right, left ^ (_splitmix64(right ^ round_key) & mask)
    return (left << half_bits) | right
