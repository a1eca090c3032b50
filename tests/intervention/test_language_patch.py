"""`patch` on a pretrained causal LM (issue 35): resample ablation per (layer, head). On a tiny random
Llama (GQA, RoPE) saved as a Hugging Face directory, one head patched with the donor window's codes
gives the loss computed here by hand (eager attention, the head's output rebuilt from the donor's
`output_attentions` and the base's values); a layer whose codes are the same in every window changes
nothing; bad input is one line from Python and the command line, nothing written or overwritten."""

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

from latentcode.cli import main
from latentcode.errors import LatentcodeError
from latentcode.inputs import CorpusWindows
from latentcode.intervention.patching import patch, plan_patch
from latentcode.intervention.patching.plan import PatchPlan
from latentcode.intervention.patching.run import groups_of
from latentcode.intervention.patching.site_groups import BANDS, band_pairs, control_heads
from latentcode.pretrained import corpus_token_windows, load_pretrained
from latentcode.token_windows import TokenWindows
from tests.pretrained_models import save_tiny_llama, tiny_llama_config, tiny_tokenizer

SEQ_LEN, N = 16, 6
INIT = 0.2  # weights large enough that one head's codes move the loss by ~0.1 nats (default 0.02: ~1e-5)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), initializer_range=INIT)


@pytest.fixture(scope="module")
def uniform_layer_0(tmp_path_factory):
    """The tiny Llama with layer 0's query projection zero: every score of layer 0 is 0, so its codes
    are 1 / (q + 1) on keys 0..q whatever the window; layer 1's are not."""
    directory = tmp_path_factory.mktemp("uniform-layer-0")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama_config(initializer_range=INIT)).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.zero_()
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def loss_per_window(logits, ids):
    """logits `[n, T, vocabulary]` of the windows' first T tokens, ids `[n, T + 1]` -> mean over
    positions of -log P(next token), `[n]`."""
    return -torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0].mean(1)


def by_hand(directory, base_ids, donor_ids, layer, heads, pairs=None):
    """Logits of the base windows with eager attention, the output of each head of `heads` in `layer`
    rebuilt by hand as P @ (the base's values of its key/value head) where it enters the output
    projection, P the base's attention probabilities (`output_attentions`) with the donor window's at
    `pairs` (a `[T, T]` bool mask; None: every pair)."""
    model = transformers.LlamaForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    config = model.config
    head_dim, group = config.head_dim, config.num_attention_heads // config.num_key_value_heads
    with torch.no_grad():
        donor_probabilities = model(input_ids=donor_ids, output_attentions=True).attentions[layer]
        base_probabilities = model(input_ids=base_ids, output_attentions=True).attentions[layer]
    pairs = torch.ones(base_ids.shape[1], base_ids.shape[1], dtype=torch.bool) if pairs is None else pairs
    probabilities = torch.where(pairs, donor_probabilities, base_probabilities)  # [batch, head, T, T]
    attention = model.model.layers[layer].self_attn
    values = {}

    def keep_values(module, args, output):
        batch, seq_len, _ = output.shape
        values["v"] = output.view(batch, seq_len, -1, head_dim)  # [batch, T, kv head, head_dim]

    def replace_heads(module, args):
        rebuilt = args[0].clone()  # [batch, T, heads * head_dim]
        for head in heads:
            rebuilt[..., head * head_dim : (head + 1) * head_dim] = probabilities[:, head] @ values["v"][:, :, head // group]
        return (rebuilt,)

    handles = [attention.v_proj.register_forward_hook(keep_values),
               attention.o_proj.register_forward_pre_hook(replace_heads)]
    try:
        with torch.no_grad():
            return model(input_ids=base_ids).logits
    finally:
        for handle in handles:
            handle.remove()


def test_donors_are_a_seeded_derangement():
    for n in (2, 3, 7, 50):
        for seed in range(5):
            donor = TokenWindows.donors(n, seed)
            assert sorted(donor) == list(range(n)) and not (donor == np.arange(n)).any()
    assert (TokenWindows.donors(50, 1) == TokenWindows.donors(50, 1)).all() and (TokenWindows.donors(50, 1) != TokenWindows.donors(50, 2)).any()


def test_patching_one_head_with_the_donors_codes_is_the_loss_computed_by_hand(tiny_llama, tmp_path):
    stem = tmp_path / "tiny"
    assert main(["patch", str(tiny_llama), "--task", f"seq_len={SEQ_LEN}", "--n", str(N), "--layers", "1",
                 "--out", str(stem), "--quiet"]) == 0
    table = pd.read_csv(stem.with_suffix(".csv")).set_index("group")
    assert list(table.index) == [f"l1.h{head}" for head in range(4)]
    pretrained = load_pretrained(tiny_llama)
    ids = torch.from_numpy(corpus_token_windows(pretrained, "validation", SEQ_LEN, N, seed=0, extra=1))
    donor = torch.from_numpy(TokenWindows.donors(N, 0))
    eager = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    with torch.no_grad():
        before = loss_per_window(eager(input_ids=ids[:, :-1]).logits, ids)
    changes = {}
    for head in range(4):
        after = loss_per_window(by_hand(tiny_llama, ids[:, :-1], ids[donor, :-1], 1, [head]), ids)
        changes[head] = (after - before).numpy()
        row = table.loc[f"l1.h{head}"]
        np.testing.assert_allclose([row["before"], row["after"], row["change"]],
                                   [before.mean().item(), after.mean().item(), (after - before).mean().item()],
                                   rtol=0, atol=1e-5)
        np.testing.assert_allclose(row["change se"], (after - before).std().item() / np.sqrt(N), rtol=1e-3)
    assert table["change"].abs().max() > 1e-2  # the heads matter: the comparison is not of zeros
    # each control is another head of layer 1, its change that head's own row
    for group, row in table.iterrows():
        assert row["control"] != group and row["control"].startswith("l1.h")
        assert row["control change"] == pytest.approx(table.loc[row["control"], "change"], abs=1e-7)
        assert row["change - control"] == pytest.approx(row["change"] - row["control change"], abs=1e-6)
    assert list(table["control"]) == [f"l1.h{h}" for h in control_heads([(1, h) for h in range(4)], 4, 0)]
    # and beside the layer's typical head: the per-window median change of its three other heads, by hand
    for head in range(4):
        typical = np.median([changes[other] for other in range(4) if other != head], axis=0)
        row = table.loc[f"l1.h{head}"]
        np.testing.assert_allclose([row["others' median change"], row["change - others' median"]],
                                   [typical.mean(), (changes[head] - typical).mean()], rtol=0, atol=1e-5)
    assert stem.with_suffix(".png").stat().st_size > 0 and stem.with_suffix(".json").is_file()


def test_a_layer_whose_codes_are_the_same_in_every_window_changes_nothing(uniform_layer_0):
    table = patch(str(uniform_layer_0), task={"seq_len": SEQ_LEN}, n=N).table.set_index("group")
    layer_0, layer_1 = table[table["layer"] == 0], table[table["layer"] == 1]
    assert len(layer_0) == len(layer_1) == 4
    assert (layer_0["change"].abs() < 1e-6).all() and (layer_0["control change"].abs() < 1e-6).all()
    assert layer_1["change"].abs().max() > 1e-2  # the windows differ where the codes do


def test_the_offset_bands_split_the_causal_pairs_by_query_minus_key():
    for seq_len in (1, 2, 6, 16):
        pairs = [pair for band in BANDS for pair in band_pairs(band, seq_len)]
        assert sorted(pairs) == [(q, k) for q in range(seq_len) for k in range(q + 1)]  # each causal pair once
    offsets = {band: {(q - k, k == 0) for q, k in band_pairs(band, 16)} for band in BANDS}
    assert offsets["sink k=0"] == {(q, True) for q in range(1, 16)}
    assert offsets["self k=q"] == {(0, False), (0, True)} and offsets["previous k=q-1"] == {(1, False)}
    assert {d for d, _ in offsets["k=q-4..q-2"]} == {2, 3, 4} and {d for d, _ in offsets["further 0<k<q-4"]} == set(range(5, 15))


def test_patching_an_offset_band_of_every_head_is_the_loss_computed_by_hand(tiny_llama):
    result = patch(str(tiny_llama), task={"seq_len": SEQ_LEN}, n=N, grid="offsets", layers=[1])
    table = result.table.set_index("group")
    assert list(table.index) == [f"l1 {band}" for band in BANDS]
    pretrained = load_pretrained(tiny_llama)
    ids = torch.from_numpy(corpus_token_windows(pretrained, "validation", SEQ_LEN, N, seed=0, extra=1))
    donor = torch.from_numpy(TokenWindows.donors(N, 0))
    for band in ("previous k=q-1", "further 0<k<q-4"):
        mask = torch.zeros(SEQ_LEN, SEQ_LEN, dtype=torch.bool)
        for query, key in band_pairs(band, SEQ_LEN):
            mask[query, key] = True
        after = loss_per_window(by_hand(tiny_llama, ids[:, :-1], ids[donor, :-1], 1, range(4), mask), ids)
        np.testing.assert_allclose(table.loc[f"l1 {band}", "after"], after.mean().item(), rtol=0, atol=1e-5)
    assert table["change"].abs().max() > 1e-2
    # beside each band a control of as many random pairs of the layer outside it, where enough are left
    assert table.loc["l1 previous k=q-1", "control"] == "l1 random 14 pairs"
    assert table.loc["l1 further 0<k<q-4", "control"] == "l1 random 55 pairs"  # 81 of the 136 causal pairs left
    groups, controls = groups_of(plan_patch(str(tiny_llama), task={"seq_len": 32}, grid="offsets", layers=[1]))
    assert controls[-1] is None and len(groups) == 2 * len(BANDS) - 1  # at T = 32 "further" has 351 of 528 pairs
    for band, control in zip(groups, controls[:-1], strict=False):
        band_set, drawn = set(band.selector.requests), set(groups[control].selector.requests)
        assert len(drawn) == len(band_set) and not drawn & band_set and all(q >= k for _, q, k in drawn)


def test_attribution_estimates_the_exact_loss_changes_where_they_are_small(tmp_path):
    directory = save_tiny_llama(tmp_path / "small-weights")  # default init: every effect ~1e-5, linear
    result = patch(str(directory), task={"seq_len": SEQ_LEN}, n=N, attribution=True)
    assert "attribution estimate" in result.table
    assert result.summary["attribution_vs_exact"]["pearson"] > 0.99


@pytest.mark.parametrize(("arguments", "python", "message"), [
    (["--n", "1"], {"n": 1}, "at least 2"),
    (["--layers", "2"], {"layers": [2]}, "the model has 2 layers (0..1)"),
    (["--task", "seq_len=65"], {"task": {"seq_len": 65}}, "seq_len=65 is beyond the context of"),
    (["--variant", "odd"], {"variant": "odd"}, "variant 'odd' needs a run's task"),  # --search works: see below
    (["--grid", "rows"], {"grid": "rows"}, "a pretrained model is patched by (layer, head)"),
    (["--sites", "1:*:*", "--layers", "0"], {"sites": "1:*:*", "layers": [0]}, "name none of the layers swept"),
])
def test_bad_input_is_one_line_from_python_and_the_command_line(tiny_llama, tmp_path, capsys, arguments, python,
                                                                message):
    python = {"task": {"seq_len": SEQ_LEN}, **python}
    with pytest.raises(LatentcodeError) as raised:
        plan_patch(str(tiny_llama), **python)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    if "--task" not in arguments:
        arguments = [*arguments, "--task", f"seq_len={SEQ_LEN}"]
    try:
        status = main(["patch", str(tiny_llama), *arguments, "--out", str(tmp_path / "t"), "--quiet"])
    except SystemExit as exit:  # argparse's own checks (--n)
        status = exit.code
    error = capsys.readouterr().err
    assert status == 2 and message in error and len(error.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_outputs_already_there_are_kept(tiny_llama, tmp_path, capsys):
    table = tmp_path / "t.csv"
    table.write_text("an earlier result\n")
    with pytest.raises(LatentcodeError, match="already exist; pass overwrite=True"):
        plan_patch(str(tiny_llama), task={"seq_len": SEQ_LEN}, out=tmp_path / "t")
    assert main(["patch", str(tiny_llama), "--task", f"seq_len={SEQ_LEN}", "--out", str(tmp_path / "t")]) == 2
    assert "already exist" in capsys.readouterr().err
    assert table.read_text() == "an earlier result\n" and sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_a_pretrained_model_plans_resample_ablation_and_a_run_refuses_its_task(tiny_llama):
    plan = plan_patch(str(tiny_llama), task={"seq_len": SEQ_LEN}, layers="1")
    assert isinstance(plan, PatchPlan) and isinstance(plan.inputs, CorpusWindows)
    assert plan.layers == (1,) and plan.n == 32
    assert plan.cost == {"groups": 4, "window_passes": 32 * 6, "passes": 6}
    with pytest.raises(LatentcodeError, match="a run's task is its own"):
        plan_patch("models/sraven-hyla", task={"seq_len": SEQ_LEN})


@pytest.mark.slow
def test_smollm2_heads_of_one_layer_on_short_windows(smollm2, tmp_path):
    stem = tmp_path / "smollm2-l3"
    assert main(["patch", "smollm2", "--task", "seq_len=24", "--n", "3", "--layers", "3", "--out", str(stem),
                 "--quiet"]) == 0
    table = pd.read_csv(stem.with_suffix(".csv"))
    assert list(table["group"]) == [f"l3.h{head}" for head in range(9)]
    assert table["control"].str.startswith("l3.h").all() and (table["control"] != table["group"]).all()
    columns = ["before", "after", "change", "change se", "control change", "control change se"]
    assert np.isfinite(table[columns].to_numpy()).all()
    assert 0 < table["before"].iloc[0] < 10  # nats per token of English text: a language model, not noise
