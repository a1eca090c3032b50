"""`intervene` on a pretrained causal LM (issue 35): the edit goes through the same SDPA interception
as every other model and is exact on a tiny random Llama (GQA, RoPE); its next-token loss is the
one computed here by hand with eager attention and one head's output zeroed before `o_proj`; bad
input is the same one line from Python and the command line."""

import numpy as np
import pytest
import torch
import transformers

from latentcode.cli import main
from latentcode.errors import LatentcodeError
from latentcode.intervention import Intervention, ScaleHeads, ZeroAblate, intervention_effects
from latentcode.pretrained import corpus_token_windows, load_pretrained
from tests.pretrained_models import save_tiny_llama

SEQ_LEN, N = 16, 6


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def eager_logits(directory, ids, zeroed=()):
    """Logits of the saved model with eager attention (the softmax written out by transformers), the
    output of each (layer, head) in `zeroed` set to zero where it enters the output projection."""
    model = transformers.LlamaForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    head_dim = model.config.head_dim
    handles = []
    for layer, head in zeroed:
        def zero_head(module, args, head=head):
            heads = args[0].clone()  # [batch, query, head * head_dim], heads concatenated
            heads[..., head * head_dim : (head + 1) * head_dim] = 0
            return (heads,)

        handles.append(model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero_head))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    for handle in handles:
        handle.remove()
    return logits


def test_an_edit_that_changes_nothing_leaves_every_logit_equal(tiny_llama):
    pretrained = load_pretrained(tiny_llama)
    ids = torch.from_numpy(corpus_token_windows(pretrained, "validation", SEQ_LEN, 3))
    with torch.no_grad():
        bare = pretrained.model(input_ids=ids, use_cache=False).logits
        with Intervention(pretrained.model, ScaleHeads(1.0), sites="*:*:*"):
            unchanged = pretrained.model(input_ids=ids, use_cache=False).logits
    assert torch.equal(unchanged, bare)


def test_zeroing_one_heads_codes_equals_zeroing_its_output_in_eager_attention(tiny_llama):
    pretrained = load_pretrained(tiny_llama)
    ids = torch.from_numpy(corpus_token_windows(pretrained, "validation", SEQ_LEN, 3))
    with torch.no_grad(), Intervention(pretrained.model, ZeroAblate(heads=[3]), sites="1:*:*"):
        edited = pretrained.model(input_ids=ids, use_cache=False).logits
    by_hand = eager_logits(tiny_llama, ids, zeroed=[(1, 3)])
    assert (by_hand - eager_logits(tiny_llama, ids)).abs().max() > 1e-3  # the head matters
    torch.testing.assert_close(edited, by_hand, rtol=0, atol=1e-5)


def next_token_loss(logits, ids):
    """logits `[n, T, vocabulary]` of the windows' first T tokens, ids `[n, T + 1]` -> the mean over
    positions of -log P(next token), `[n]`."""
    log_probabilities = torch.log_softmax(logits, dim=-1)
    return -log_probabilities.gather(-1, ids[:, 1:, None])[..., 0].mean(1)


def test_the_tables_loss_before_and_after_is_the_loss_computed_by_hand(tiny_llama):
    table = intervention_effects(str(tiny_llama), ZeroAblate(heads=[0, 2]), sites="1:*:*", task={"seq_len": SEQ_LEN},
                                 n=N, batch_size=4)
    pretrained = load_pretrained(tiny_llama)
    ids = torch.from_numpy(corpus_token_windows(pretrained, "validation", SEQ_LEN, N, seed=0, extra=1))
    inputs = ids[:, :-1]
    loss = table[table["metric"] == "next-token loss"].set_index("scope")
    before = next_token_loss(eager_logits(tiny_llama, inputs), ids)
    after = next_token_loss(eager_logits(tiny_llama, inputs, zeroed=[(1, 0), (1, 2)]), ids)
    alone = next_token_loss(eager_logits(tiny_llama, inputs, zeroed=[(1, 2)]), ids)
    np.testing.assert_allclose(loss.loc["all sites", ["before", "after"]].to_numpy(float),
                               [before.mean().item(), after.mean().item()], rtol=1e-5)
    np.testing.assert_allclose(loss.loc["l1.h2", "after"], alone.mean().item(), rtol=1e-5)
    assert loss.loc["all sites", "change se"] > 0
    # the controls: the same edit at as many other heads of layer 1, measured on the same windows
    controls = table[(table["role"] == "control") & (table["metric"] == "next-token loss")]
    assert len(controls) == 3  # for all sites, l1.h0 and l1.h2
    together = controls[controls["scope"].str.startswith("control for all sites: ")]["scope"].item()
    assert together == "control for all sites: l1.h1,l1.h3"  # the only two heads left in layer 1
    control_loss = next_token_loss(eager_logits(tiny_llama, inputs, zeroed=[(1, 1), (1, 3)]), ids)
    np.testing.assert_allclose(controls.set_index("scope").loc[together, "after"], control_loss.mean().item(),
                               rtol=1e-5)


def test_an_identity_edit_changes_no_metric(tiny_llama):
    table = intervention_effects(str(tiny_llama), ScaleHeads(1.0), sites="*:*:*", task={"seq_len": SEQ_LEN}, n=2,
                                 per_site=False)
    assert (table["change"] == 0).all() and (table["after"] == table["before"]).all()


@pytest.mark.parametrize(("arguments", "python", "message"), [
    (["--sites", "2:*:*", "--zero-ablate", "0"], {"sites": "2:*:*", "edits": ZeroAblate(heads=[0])},
     "site 2:*:*: layer 2 is outside the model's 2 layers (0..1)"),
    (["--sites", "1:*:*", "--zero-ablate", "4"], {"sites": "1:*:*", "edits": ZeroAblate(heads=[4])},
     "head 4 is outside the 4 heads of"),
    (["--sites", "1:*:*", "--zero-ablate", "0", "--task", "seq_len=65"],
     {"sites": "1:*:*", "edits": ZeroAblate(heads=[0]), "task": {"seq_len": 65}},
     "seq_len=65 is beyond the context of"),
    (["--sites", "1:70:*", "--zero-ablate", "0"], {"sites": "1:70:*", "edits": ZeroAblate(heads=[0])},
     "site 1:70:*: position 70 is outside the sequence of 16 tokens"),
])
def test_bad_input_is_the_same_one_line_from_python_and_the_command_line(tiny_llama, tmp_path, capsys, arguments,
                                                                          python, message):
    python = {"task": {"seq_len": SEQ_LEN}, "n": 2, **python}
    with pytest.raises(LatentcodeError) as raised:
        intervention_effects(str(tiny_llama), python.pop("edits"), **python)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    if "--task" not in arguments:
        arguments = [*arguments, "--task", f"seq_len={SEQ_LEN}"]
    status = main(["intervene", str(tiny_llama), *arguments, "--n", "2", "--out", str(tmp_path / "t"), "--quiet"])
    error = capsys.readouterr().err
    assert status == 2 and str(raised.value) in error and len(error.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_smollm2_one_head_zero_ablated_on_short_windows(smollm2, tmp_path, capsys):
    from latentcode.pretrained import SMOLLM2_SHAPE, attention_shape, smollm2_path

    assert attention_shape(smollm2_path()) == SMOLLM2_SHAPE  # the plans' constant is what the file declares
    stem = tmp_path / "smollm2-l3h0"
    assert main(["intervene", "smollm2", "--sites", "3:*:*", "--zero-ablate", "0", "--task", "seq_len=64",
                 "--n", "4", "--out", str(stem), "--quiet"]) == 0
    import pandas as pd

    table = pd.read_csv(stem.with_suffix(".csv"))
    loss = table[table["metric"] == "next-token loss"]
    assert set(loss["role"]) == {"edit", "control"} and len(loss) == 2
    assert np.isfinite(loss[["before", "after", "change", "change se"]].to_numpy()).all()
    assert 0 < loss["before"].iloc[0] < 10  # nats per token of English text: a language model, not noise


def test_mean_ablation_takes_the_mean_pattern_of_a_compact_store_of_training_windows(tiny_llama, tmp_path):
    import latentcode
    from latentcode.intervention.plan import mean_ablate_from_compact, plan_intervention
    from latentcode.store import Site

    codes = latentcode.extract(str(tiny_llama), {"seq_len": SEQ_LEN}, "*:-1:-1", split="train", n=5,
                               out=tmp_path / "train.h5", progress=False)
    plan = plan_intervention(str(tiny_llama), sites="1:*:*", task={"seq_len": SEQ_LEN}, n=2)
    edit = mean_ablate_from_compact(codes, plan, heads=[1])
    pretrained = load_pretrained(tiny_llama)
    ids = torch.from_numpy(corpus_token_windows(pretrained, "train", SEQ_LEN, 5, seed=0))
    eager = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = eager(input_ids=ids, output_attentions=True).attentions[1].mean(0)  # [H, T, T]
    assert len(edit.means) == SEQ_LEN * SEQ_LEN and edit.heads == [1]
    for query, key in [(0, 0), (5, 3), (SEQ_LEN - 1, 0), (SEQ_LEN - 1, SEQ_LEN - 1), (2, 9)]:
        np.testing.assert_allclose(edit.means[Site(1, query, key)], attentions[:, query, key].numpy(), atol=1e-6)
    with pytest.raises(LatentcodeError, match="has windows of 16 tokens; mean-ablating a pretrained model needs"):
        mean_ablate_from_compact(codes, plan_intervention(str(tiny_llama), sites="1:*:*", task={"seq_len": 8}), [1])


def test_the_command_line_writes_the_table_python_returns_and_its_plot(tiny_llama, tmp_path, capsys):
    import pandas as pd

    stem = tmp_path / "tiny-l1"
    assert main(["intervene", str(tiny_llama), "--sites", "1:*:*", "--zero-ablate", "1,2", "--task",
                 f"seq_len={SEQ_LEN}", "--n", "3", "--out", str(stem), "--quiet"]) == 0
    assert "outputs read at positions 0..15 (T=16)" in capsys.readouterr().out
    written = pd.read_csv(stem.with_suffix(".csv"))
    table = intervention_effects(str(tiny_llama), ZeroAblate(heads=[1, 2]), sites="1:*:*",
                                 task={"seq_len": SEQ_LEN}, n=3)
    assert list(written["scope"]) == list(table["scope"])
    np.testing.assert_allclose(written[["before", "after", "change"]], table[["before", "after", "change"]], rtol=1e-6)
    assert stem.with_suffix(".png").stat().st_size > 0 and stem.with_suffix(".json").is_file()
