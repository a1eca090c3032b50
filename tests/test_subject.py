"""`subject_of`: the one description of a model every command takes, read from its files (issue 47).
Its attention shape is the one the loaded model has, and what it cannot take is one line."""

from pathlib import Path

import pytest
import torch

from latentcode import subject_of
from latentcode.errors import LatentcodeError
from latentcode.models import load_model
from latentcode.tasks import get_task
from latentcode.token_windows import TokenWindows
from latentcode.training.run import Run
from tests.pretrained_models import save_tiny_llama

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.mark.parametrize("name", ["sraven-hyla", "fuzzy_logic-softmax", "language-linear"])
def test_a_runs_shape_is_its_loaded_models(name):
    subject = subject_of(MODELS / name)
    model = load_model(MODELS / name / "model")
    assert (subject.n_layers, subject.n_heads, subject.n_ctx) == (
        model.config.n_layers, model.config.sizes.n_heads, model.config.n_ctx)
    assert subject.task(None).config() == get_task(**Run(MODELS / name).config.task).config()  # its run's task
    loaded = subject.load()
    assert not loaded.model.training and loaded.identity["checkpoint_sha256"]


def test_a_causal_lms_shape_is_its_loaded_models_and_it_reads_token_windows(tmp_path):
    directory = save_tiny_llama(tmp_path / "llama")
    subject = subject_of(directory)
    loaded = subject.load()
    config = loaded.model.config
    assert (subject.n_layers, subject.n_heads, subject.n_ctx) == (
        config.num_hidden_layers, config.num_attention_heads, config.max_position_embeddings)
    windows = subject.task({"seq_len": 16})
    assert isinstance(windows, TokenWindows) and windows.seq_len == 16
    ids = windows.draw(loaded, "validation", 2, seed=0, extra=1)
    assert ids.shape == (2, 17) and loaded.logits(torch.from_numpy(ids[:, :-1])).shape[:2] == (2, 16)
    assert subject_of(loaded.pretrained).n_heads == subject.n_heads  # a loaded Pretrained is a subject too


@pytest.mark.parametrize(("given", "message"), [
    (42, "run_or_model is a int; expected a run or model directory"),
    (torch.nn.Linear(2, 2), "run_or_model is a Linear; extract, intervene and patch take latentcode models"),
    ("no/such/run", "no/such/run is neither a finished run directory"),
])
def test_what_is_no_model_is_one_line(given, message):
    with pytest.raises(LatentcodeError) as raised:
        subject_of(given)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("seq_len", [1, 7, 64])
def test_a_windows_partitions_are_a_tasks_each_position_once(seq_len):
    """Windows are a task like the others for patch's partition grids and search: `task_partitions` reads
    them, each partition covers every position once, and every position predicts (no context part)."""
    from latentcode.tasks.partitions import task_partitions

    partitions = task_partitions(TokenWindows("m", seq_len))
    assert set(partitions) == {"context", "first", "quarter"}
    for parts in partitions.values():
        assert sorted(p for positions in parts.values() for p in positions) == list(range(seq_len))
    assert partitions["context"] == {"query": tuple(range(seq_len))}
    assert partitions["first"]["first token"] == (0,)
