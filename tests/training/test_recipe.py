"""The paper's recipe: schedule, weight-decay mask, losses, presets."""

import math

import pytest
import torch

from latentcode import ModelConfig, build_model
from latentcode.models import ConfigError
from latentcode.training import build_train_config
from latentcode.training.objective import task_loss
from latentcode.training.optimizer import is_decayed, parameter_groups
from latentcode.training.presets import presets
from latentcode.training.schedule import build_scheduler, lr_multiplier


def test_schedule_start_end_of_warmup_and_last_step():
    warmup, total = 100, 1000
    assert lr_multiplier(0, warmup, total) == 0.0
    assert lr_multiplier(50, warmup, total) == pytest.approx(0.5)
    assert lr_multiplier(warmup, warmup, total) == pytest.approx(1.0)
    assert lr_multiplier(total - 1, warmup, total) == pytest.approx(0.1)
    midway = warmup + (total - 1 - warmup) / 2
    assert lr_multiplier(midway, warmup, total) == pytest.approx(0.55)  # cosine at half: 0.1 + 0.9 / 2
    values = [lr_multiplier(step, warmup, total) for step in range(warmup, total)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False)), "decays monotonically"


def test_scheduler_drives_the_optimizer_learning_rate():
    parameter = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = torch.optim.AdamW([parameter], lr=3e-3)
    scheduler = build_scheduler(optimizer, warmup_steps=4, total_steps=10)
    seen = []
    for _ in range(10):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen[0] == 0.0 and seen[4] == pytest.approx(3e-3) and seen[9] == pytest.approx(3e-4)


def test_weight_decay_applies_to_matrices_only():
    model = build_model(ModelConfig(attention="hyla_deep", n_layers=1, d_model=8, n_heads=2, kqv_dim=4, d_mlp=8,
                                    n_ctx=6, d_in=3, d_out=2))
    decayed = {name for name, p in model.named_parameters() if is_decayed(name, p)}
    assert decayed == {
        "embed.W_E", "blocks.0.attn.W_Q", "blocks.0.attn.W_K", "blocks.0.attn.W_V", "blocks.0.attn.W_O",
        "blocks.0.attn.value_network.W_value2", "blocks.0.mlp.W_in", "blocks.0.mlp.W_out", "unembed.W_U",
    }
    groups = parameter_groups(model, weight_decay=0.1)
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    exempt = {id(p) for p in groups[1]["params"]}
    assert id(model.blocks[0].attn.relative_position_bias.bias_table) in exempt
    assert id(model.blocks[0].attn.b_Q) in exempt and id(model.blocks[0].ln1.w) in exempt


def test_losses():
    predictions = torch.tensor([[[0.5]], [[1.0]]])
    assert task_loss("regression", predictions, torch.tensor([[0.0], [1.0]])).item() == pytest.approx(0.125)
    logits = torch.zeros(2, 4, 8)
    assert task_loss("classification", logits, torch.zeros(2, 4, dtype=torch.long)).item() == pytest.approx(math.log(8))


def test_presets_follow_the_paper_and_scale_the_instances():
    fuzzy = build_train_config("fuzzy_logic", "paper", "hyla")
    assert (fuzzy.batch_size, fuzzy.steps, fuzzy.warmup_steps, fuzzy.learning_rate) == (128, 50_000, 100, 1e-3)
    model = fuzzy.model_config()
    assert (model.n_layers, model.d_model, model.n_heads, model.kqv_dim, model.d_mlp) == (2, 128, 8, 16, 256)
    assert model.attention_name == "hyla" and model.attn_dropout == 0.1 and model.n_ctx == 32 and model.d_in == 5
    sraven = build_train_config("sraven", "paper", "softmax", n_layers=8, width_factor=2)
    assert sraven.n_train_instances == 20_000_000 and sraven.warmup_steps == 1000
    assert sraven.model_config().sizes.n_heads == 32 and sraven.model_config().n_layers == 8
    tiny = build_train_config("sraven", "tiny", "linear")
    assert tiny.steps < 50 and "tiny" in tiny.scale and "capped" in tiny.notes["warmup"]


@pytest.mark.parametrize("preset", presets())
def test_the_tiny_scale_builds_a_small_model_the_user_can_still_override(preset):
    """tiny is a smoke test: SRAVEN's tiny scale built the paper's 4 layers of d_model 128 (issue 24).
    Every task's preset (the registry's, none listed here)."""
    model = build_train_config(preset, "tiny", "hyla").model_config()
    assert model.n_layers <= 2 and model.d_model <= 32 and model.d_mlp <= 64 and model.kqv_dim <= 16
    assert build_train_config(preset, "tiny", "hyla", d_model=48).model_config().d_model == 48
    paper = build_train_config(preset, "paper", "hyla").model_config()
    setup = presets()[preset]
    assert paper.d_model == setup.model["d_model"] * setup.model.get("width_factor", 1), "only tiny shrinks the model"


@pytest.mark.parametrize("preset", ["fuzzy_logic", "sraven", "language"])
def test_the_paper_scale_is_the_papers_width(preset):
    assert build_train_config(preset, "paper", "hyla").model_config().d_model == 128  # the paper's d_model


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(preset="mnist"), rf"unknown preset 'mnist'; valid presets: {', '.join(presets())}$"),
        (dict(preset="sraven", scale="huge"), r"unknown scale 'huge'; valid scales: tiny, demo, cpu, paper"),
        (dict(preset="sraven", attention="hyper"), r"unknown attention preset 'hyper'"),
        (dict(preset="sraven", width_factor=3, n_heads=5), r"kqv_dim=64 is not divisible by n_heads=5"),
        (dict(preset="fuzzy_logic", n_features=3), r"the fuzzy_logic task has no parameter 'n_features'"),
        (dict(preset="fuzzy_logic", warmup_steps=10_000), r"warmup_steps=10000 is not less than the 8000 training steps"),
        (dict(preset="sraven", variant="shuffled"),
         r"^unknown variant 'shuffled' for task 'sraven'; valid variants: \['permuted', 'unpermuted'\]"),
    ],
)
def test_contradictory_configs_are_refused(args, message):
    preset = args.pop("preset")
    with pytest.raises(ConfigError, match=message):
        build_train_config(preset, args.pop("scale", "cpu"), args.pop("attention", "softmax"), **args)
