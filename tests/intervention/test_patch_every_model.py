"""One `patch` for every model (issue 47 item 1): the heads grid with its random-head control,
attribution and the search run on the shipped SRAVEN model (counterfactual pairs, read on the
transfer) and on a tiny random Llama (token windows with resample donors, read on the next-token
loss change) through the same function, and each number is checked against a computation that
does not go through `patch`'s loop: `transfer_sweep` on the same pairs, additivity of attribution
over heads, and a sweep of the group a search found on the fresh bases it reports."""

from pathlib import Path

import numpy as np
import pytest

from latentcode.inputs import CorpusWindows, TaskInstances
from latentcode.intervention.patching import head_grid, patch, plan_patch
from latentcode.intervention.patching.site_groups import BANDS, band_pairs, control_heads
from tests.pretrained_models import save_tiny_llama

SRAVEN = Path(__file__).resolve().parents[2] / "models" / "sraven-hyla"
pytestmark = pytest.mark.skipif(not SRAVEN.is_dir(), reason="shipped checkpoint missing")
SEQ_LEN, WINDOWS = 16, 6


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), initializer_range=0.2))


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):  # default init: every effect small, attribution close to exact
    return str(save_tiny_llama(tmp_path_factory.mktemp("small-llama")))


def options(model: str) -> dict:
    """A small sweep of one layer of each model: SRAVEN's layer 0 (where single heads transfer), the
    Llama's layer 1 on windows of 16 tokens."""
    if model == "sraven":
        return {"layers": [0], "n": 24}
    return {"layers": [1], "n": WINDOWS, "task": {"seq_len": SEQ_LEN}}


def paired(values: np.ndarray) -> tuple[float, float]:
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))


def test_one_plan_for_both_inputs():
    plan = plan_patch(SRAVEN, grid="heads", layers=[0], n=8)
    assert isinstance(plan.inputs, TaskInstances) and plan.inputs.effect == "transfer"
    assert plan.layers == (0,) and plan.cost == {"groups": 16, "examples": 3 * 8 * 18}


@pytest.mark.parametrize("model", ["sraven", "llama"])
def test_the_heads_grid_has_a_random_head_control_on_every_model(model, llama):
    run = str(SRAVEN) if model == "sraven" else llama
    result = patch(run, grid="heads", **options(model))
    plan = plan_patch(run, grid="heads", **options(model))
    effect = plan.inputs.effect
    table = result.table.set_index("group")
    n_heads = plan.n_heads
    assert len(table) == n_heads and set(table["layer"]) == set(plan.layers)
    heads = control_heads([(plan.layers[0], head) for head in range(n_heads)], n_heads, plan.seed)
    assert [table.index[head] for head in heads] == list(table["control"])  # another head of the same layer
    for group, row in table.iterrows():
        assert row["control"] != group
        assert row[f"control {effect}"] == pytest.approx(table.loc[row["control"], effect], abs=1e-9)
        assert row[f"{effect} - control"] == pytest.approx(row[effect] - row[f"control {effect}"], abs=1e-9)
    assert result.summary["control"].startswith("another head of the same layer")
    if model == "llama":
        assert isinstance(plan.inputs, CorpusWindows) and table["change"].abs().max() > 1e-2
        return
    # on the run, each head's numbers are transfer_sweep's on the same pairs, and the paired control and
    # others' median columns are those of its per-pair transfers, by hand
    from latentcode.intervention.transfer import per_example, transfer_sweep
    from latentcode.training.run import Run

    record = Run(SRAVEN)
    task = record.task()
    pairs = task.counterfactual_pairs(24, plan.split, seed=0, variant=plan.variant, prediction=-1)
    groups = head_grid(4, n_heads, sites="0:*:*")
    expected = transfer_sweep(record.load_model().eval(), task, pairs, groups, relations=("different", "third", "same"))
    np.testing.assert_allclose(result.table["transfer"], expected["transfer"], atol=1e-9)
    np.testing.assert_allclose(result.table["damage"], expected["damage"], atol=1e-9)
    assert np.abs(expected["transfer"]).max() > 0  # a comparison of more than zeros
    transfers = per_example(expected, "different", "follow") - per_example(expected, "third", "follow")
    for head, control in enumerate(heads):
        row = result.table.iloc[head]
        np.testing.assert_allclose([row["transfer - control"], row["transfer - control se"]],
                                   paired(transfers[head] - transfers[control]), atol=1e-9)
        typical = np.median(np.delete(transfers, head, axis=0), axis=0)
        np.testing.assert_allclose([row["others' median transfer"], row["transfer - others' median"]],
                                   [typical.mean(), (transfers[head] - typical).mean()], atol=1e-9)


@pytest.mark.parametrize("model", ["sraven", "small_llama"])
def test_attribution_adds_up_over_heads_on_every_model(model, small_llama):
    """Attribution is a sum over sites and heads: a layer's estimate is the sum of its heads'; and it
    sits beside the exact effect of its objective (the logit difference; the next-token loss)."""
    run = str(SRAVEN) if model == "sraven" else small_llama
    layer = options(model.removeprefix("small_"))["layers"][0]
    common = {key: value for key, value in options(model.removeprefix("small_")).items() if key != "layers"}
    heads = patch(run, grid="heads", layers=[layer], attribution=True, **common)
    whole = patch(run, groups=[f"{layer}:*:*"], attribution=True, **common)
    estimate = heads.table["attribution estimate"]
    assert whole.table["attribution estimate"].iloc[0] == pytest.approx(estimate.sum(), rel=1e-4, abs=1e-9)
    assert np.abs(estimate).max() > 0 and set(heads.summary["attribution_vs_exact"]) == {"pearson", "spearman"}
    if model == "small_llama":  # effects ~1e-5: the first-order estimate is close to exact
        assert heads.summary["attribution_vs_exact"]["pearson"] > 0.99


@pytest.mark.parametrize("model", ["sraven", "llama"])
def test_the_search_runs_on_every_model_and_reports_fresh_bases(model, llama):
    """The search chooses on the selection bases and reports the route on fresh ones (seed + 1): the
    found group's numbers there are those of a sweep of that group on the same fresh bases."""
    run = str(SRAVEN) if model == "sraven" else llama
    setting = options(model)
    result = patch(run, search=True, confirm_n=setting["n"], **setting)
    route, candidates = result.tables
    assert len(route) == 3 and route["step"].iloc[0].startswith("layer: ") and len(candidates) > len(route)
    found = result.summary["found"]
    fresh = {**setting, "seed": 1, "n": setting["n"]}
    del fresh["layers"]
    # a window is read from the first query its groups change: a pair at query 0 keeps it at 0, as the search's
    groups = [found] if model == "sraven" else [found, f"{route['layer'].iloc[-1]}:0:0"]
    swept = patch(run, groups=groups, **fresh).table.iloc[0]
    effect = "transfer" if model == "sraven" else "change"
    assert route[effect].iloc[-1] == pytest.approx(swept[effect], abs=1e-6)
    assert route[f"{effect} se"].iloc[-1] == pytest.approx(swept[f"{effect} se"], abs=1e-6)


def test_a_run_gets_offset_bands_with_their_controls():
    from latentcode.intervention.patching.run import groups_of

    result = patch(SRAVEN, grid="offsets", layers=[0], n=8)
    table = result.table
    assert list(table["band"]) == list(BANDS)
    assert list(table["pairs"]) == [len(band_pairs(band, 36)) for band in BANDS]
    groups, controls = groups_of(plan_patch(SRAVEN, grid="offsets", layers=[0], n=8))
    assert len(groups) == result.summary["groups"] > len(BANDS)
    for band, control, name in zip(BANDS, controls, table["control"], strict=True):
        if control is None:  # fewer causal pairs left outside the band than in it
            assert name == ""
            continue
        drawn = set(groups[control].selector.requests)
        assert name == groups[control].name and len(drawn) == len(band_pairs(band, 36))
        assert not drawn & {(0, q, k) for q, k in band_pairs(band, 36)} and all(q >= k for _, q, k in drawn)


def test_a_causal_lm_gets_partition_grids_of_its_windows(llama):
    """A window has no task structure, only position: its partitions are the first token vs the later
    ones and four quarters. A block whose keys all come after its queries holds codes that are 0 in every
    window (the causal mask), so patching it changes nothing; the blocks on and below the diagonal do."""
    table = patch(llama, grid="quarter", **options("llama")).table
    assert len(table) == 16 and set(table["query_part"]) == {f"quarter {part}" for part in range(4)}
    later = table["query_part"] < table["key_part"]  # "quarter 0" < "quarter 3": keys after the queries
    assert later.sum() == 6 and (table.loc[later, "change"] == 0).all()
    assert table.loc[~later, "change"].abs().max() > 1e-3
