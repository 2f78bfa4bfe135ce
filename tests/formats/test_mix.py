"""The mixture plan: resolution, the blend's window tolerance, epochs, phases, determinism."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from pydantic import ValidationError

from formats.mix import BLOCK_SIZE, MixPhase, MixPlan, MixSpec, MixSpecError, resolve_mix

SEQ_LEN = 128


def sources(**sequences: int) -> dict[str, dict[str, int]]:
    return {name: {"sequences": n, "tokens": n * SEQ_LEN} for name, n in sequences.items()}


def window_deviation(source: np.ndarray, weights: tuple[float, ...], window: int) -> float:
    """Largest |share - weight| of any source over every window of ``window`` positions."""
    worst = 0.0
    for i, w in enumerate(weights):
        seen = np.concatenate([[0], np.cumsum(source == i)])
        worst = max(worst, float(np.abs((seen[window:] - seen[:-window]) / window - w).max()))
    return worst


@pytest.mark.parametrize(
    "weights",
    [
        {"a": 0.5, "b": 0.3, "c": 0.2},
        {"a": 0.9, "b": 0.05, "c": 0.05},
        {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
        {"a": 0.999, "b": 0.0005, "c": 0.0005},
    ],
)
@pytest.mark.parametrize("window", [100, 1000, 10_000])
def test_every_window_stays_within_the_stated_tolerance(weights, window):
    plan = resolve_mix(
        MixSpec(weights=weights), sources(a=40_000, b=40_000, c=40_000), SEQ_LEN, 150_000 * SEQ_LEN
    )
    source, _, _ = plan.locate(np.arange(plan.total_samples))
    assert window_deviation(source, plan.phases[0].weights, window) <= plan.window_tolerance(window)


def test_window_tolerance_holds_for_many_sources_with_random_weights():
    rng = np.random.default_rng(7)
    raw = rng.dirichlet(np.full(12, 2.0))
    raw[-1] = 1 - raw[:-1].sum()
    names = [f"s{i:02d}" for i in range(12)]
    spec = MixSpec(weights=dict(zip(names, raw.tolist(), strict=True)), max_epochs=1000)
    plan = resolve_mix(spec, sources(**{n: 10_000 for n in names}), SEQ_LEN, 3 * BLOCK_SIZE * SEQ_LEN)
    source, _, _ = plan.locate(np.arange(plan.total_samples))
    for window in (50, 500, 5000):
        assert window_deviation(source, plan.phases[0].weights, window) <= plan.window_tolerance(window)
    assert np.array_equal(np.bincount(source, minlength=12), plan.samples)


def test_locate_is_a_pure_function_of_the_position():
    plan = resolve_mix(MixSpec(temperature=2.0, seed=3), sources(a=5000, b=800, c=200), SEQ_LEN)
    everything = plan.locate(np.arange(plan.total_samples))
    positions = np.random.default_rng(0).permutation(plan.total_samples)[:3000]
    scattered = plan.locate(positions)
    for full, part in zip(everything, scattered, strict=True):
        assert np.array_equal(full[positions], part)
    reloaded = MixPlan.from_json(plan.to_json())
    assert all(
        np.array_equal(x, y)
        for x, y in zip(everything, reloaded.locate(np.arange(plan.total_samples)), strict=True)
    )
    assert reloaded.sha256() == plan.sha256() == hashlib.sha256(plan.to_json().encode()).hexdigest()


def test_each_epoch_reads_every_sequence_of_a_source_exactly_once():
    plan = resolve_mix(
        MixSpec(weights={"a": 0.7, "b": 0.3}, max_epochs=10), sources(a=1000, b=97), SEQ_LEN, 3000 * SEQ_LEN
    )
    source, epoch, index = plan.locate(np.arange(plan.total_samples))
    for i, n in enumerate(plan.source_sequences):
        mine_epoch, mine_index = epoch[source == i], index[source == i]
        assert np.all(np.diff(mine_epoch) >= 0), "epochs follow each other"
        for e in range(int(mine_epoch.max())):  # every complete epoch is a permutation
            assert np.array_equal(np.sort(mine_index[mine_epoch == e]), np.arange(n))
        last = mine_index[mine_epoch == mine_epoch.max()]
        assert len(np.unique(last)) == len(last)
    b_epochs = [index[(source == 1) & (epoch == e)] for e in range(3)]
    assert not np.array_equal(b_epochs[0], b_epochs[1]) and not np.array_equal(b_epochs[1], b_epochs[2])
    assert plan.epochs[1] == pytest.approx(plan.samples[1] / 97) and plan.epochs[1] > 9


def test_order_inside_a_source_depends_on_seed_source_and_epoch_only():
    def order_of_a(extra_sources: dict, seed: int) -> np.ndarray:
        spec = MixSpec(temperature=1.0, seed=seed)
        plan = resolve_mix(spec, sources(a=500, **extra_sources), SEQ_LEN)
        source, epoch, index = plan.locate(np.arange(plan.total_samples))
        a = plan.source_names.index("a")
        return index[(source == a) & (epoch == 0)]

    alone = order_of_a({}, seed=1)
    assert np.array_equal(alone, order_of_a({"zz": 300, "b": 50}, seed=1))
    assert not np.array_equal(alone, order_of_a({}, seed=2))
    assert not np.array_equal(alone, np.arange(500)), "sequences are shuffled"


def test_huge_sources_are_permuted_without_materialising_them():
    plan = resolve_mix(
        MixSpec(weights={"big": 0.5, "small": 0.5}, max_epochs=2),
        sources(big=10**12, small=10**6),
        SEQ_LEN,
        2 * 10**6 * SEQ_LEN,
    )
    source, _, index = plan.locate(np.arange(0, plan.total_samples, 997))
    big = index[source == plan.source_names.index("big")]
    assert big.max() < 10**12 and len(np.unique(big)) == len(big)
    assert big.max() > 10**10, "indices spread over the whole source"


def test_temperature_weights_follow_token_counts():
    counts = sources(a=8000, b=2000, c=1000)
    proportional = resolve_mix(MixSpec(temperature=1.0), counts, SEQ_LEN).phases[0].weights
    assert proportional == pytest.approx([8000 / 11000, 2000 / 11000, 1000 / 11000])
    flattened = resolve_mix(MixSpec(temperature=3.0, max_epochs=100), counts, SEQ_LEN).phases[0].weights
    expected = np.array([8000, 2000, 1000]) ** (1 / 3)
    assert flattened == pytest.approx(expected / expected.sum())
    assert resolve_mix(MixSpec(), counts, SEQ_LEN).phases[0].weights == proportional


def test_default_budget_is_one_pass_and_token_budgets_convert_by_seq_len():
    plan = resolve_mix(MixSpec(), sources(a=3000, b=1000), SEQ_LEN)
    assert plan.total_samples == 4000 and plan.total_tokens == 4000 * SEQ_LEN
    assert plan.samples == (3000, 1000) and plan.epochs == (1.0, 1.0)
    assert plan.token_budgets == (3000 * SEQ_LEN, 1000 * SEQ_LEN)
    assert np.array_equal(plan.counts(plan.total_samples), plan.samples)
    source, _, _ = plan.locate(np.arange(1234))
    assert np.array_equal(plan.counts(1234), np.bincount(source, minlength=2))


def test_default_budget_is_shortened_so_no_source_exceeds_its_cap():
    spec = MixSpec(weights={"a": 0.5, "b": 0.5}, max_epochs=2, max_epochs_per_source={"a": 3})
    plan = resolve_mix(spec, sources(a=10_000, b=1000), SEQ_LEN)
    assert plan.samples[1] <= 2000 and plan.samples[1] >= 1999, "the small source hits its cap"
    assert plan.epochs[0] <= 3 and plan.max_epochs == (3.0, 2.0)


def test_an_explicit_budget_beyond_a_cap_fails_naming_the_source():
    spec = MixSpec(weights={"a": 0.5, "b": 0.5}, max_epochs=4)
    with pytest.raises(MixSpecError, match=r"source 'b' would need 5\.00 epochs.*above its cap of 4"):
        resolve_mix(spec, sources(a=10_000, b=1000), SEQ_LEN, total_tokens=10_000 * SEQ_LEN)


def test_phases_switch_weights_at_their_token_boundaries():
    spec = MixSpec(
        phases=[
            MixPhase(until_tokens=1000 * SEQ_LEN + 5, weights={"web": 1.0, "code": 0.0}),
            MixPhase(until_tokens=3000 * SEQ_LEN, weights={"web": 0.25, "code": 0.75}),
            MixPhase(temperature=1.0),
        ],
        max_epochs=50,
    )
    plan = resolve_mix(spec, sources(web=4000, code=500), SEQ_LEN, total_tokens=6000 * SEQ_LEN)
    assert [(p.start, p.stop) for p in plan.phases] == [(0, 1000), (1000, 3000), (3000, 6000)]
    source, epoch, index = plan.locate(np.arange(plan.total_samples))
    code = plan.source_names.index("code")
    assert not np.any(source[:1000] == code) and np.any(source[1000:1004] == code)
    assert np.count_nonzero(source[1000:3000] == code) == 1500
    assert np.count_nonzero(source[3000:] == code) == pytest.approx(3000 * 500 / 4500, abs=1)
    # draws continue across phases: code's 1500 phase-2 samples are 3 epochs, phase 3 starts epoch 3
    first_phase3 = np.flatnonzero(source[3000:] == code)[0] + 3000
    assert epoch[first_phase3] == 3 and plan.samples[code] == np.count_nonzero(source == code)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (dict(weights={"a": 0.5, "b": 0.5, "x": 0.0}), r"name source 'x', which is not in the manifest"),
        (
            dict(weights={"a": 1.2, "b": -0.2}),
            r"weight of source 'b' in the spec is -0.2; weights must be >= 0",
        ),
        (dict(weights={"a": 0.5, "b": 0.4}), r"weights in the spec sum to 0.9, not 1"),
        (dict(weights={"a": 1.0}), r"do not name source 'b'; give it a weight"),
        (dict(temperature=0.0), r"temperature in the spec is 0.0; it must be a positive number"),
        (dict(weights={"a": 0.5, "b": 0.5}, temperature=2.0), r"either explicit weights or a temperature"),
        (dict(max_epochs=0), r"epoch cap of 'max_epochs' is 0"),
        (
            dict(
                phases=[
                    MixPhase(until_tokens=5000, temperature=1.0),
                    MixPhase(until_tokens=4000, temperature=1.0),
                ]
            ),
            r"phase boundaries are out of order: phase 2 ends at 4000 tokens, not after phase 1's 5000",
        ),
        (dict(phases=[MixPhase(temperature=1.0), MixPhase(temperature=2.0)]), r"phase 1 has no until_tokens"),
        (
            dict(phases=[MixPhase(until_tokens=10)]),
            r"phase 1 must give exactly one of weights or temperature",
        ),
        (
            dict(weights={"a": 0.5, "b": 0.5}, phases=[MixPhase(temperature=1.0)]),
            r"either at the top level or in each phase, not both",
        ),
        (dict(weights={"a": 0.5, "b": 0.5}, total_tokens=20_000 * SEQ_LEN), r"source 'b' would need"),
        (dict(weights={"a": 0.999999, "b": 0.000001}), r"below the blend's resolution"),
    ],
)
def test_invalid_specs_fail_with_one_sentence_naming_the_problem(spec, message):
    with pytest.raises((MixSpecError, ValidationError), match=message) as caught:
        resolve_mix(MixSpec(**spec), sources(a=10_000, b=1000), SEQ_LEN)
    if isinstance(caught.value, MixSpecError):
        assert "\n" not in str(caught.value)


def test_locate_refuses_positions_outside_the_plan():
    plan = resolve_mix(MixSpec(), sources(a=100), SEQ_LEN)
    with pytest.raises(IndexError, match="position 100 is outside this mix plan's 100 samples"):
        plan.locate(np.array([5, 100]))
    with pytest.raises(IndexError, match="position -1"):
        plan.locate(-1)


def test_sources_with_weight_but_no_sequences_are_refused():
    with pytest.raises(MixSpecError, match="source 'b' has weight in phase 1 but no sequences"):
        resolve_mix(MixSpec(weights={"a": 0.5, "b": 0.5}), sources(a=100, b=0), SEQ_LEN)
    plan = resolve_mix(MixSpec(weights={"a": 1.0, "b": 0.0}), sources(a=100, b=0), SEQ_LEN)
    assert plan.samples == (100, 0)
