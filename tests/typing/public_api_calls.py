"""Calls of every public function of `latentcode`, type-checked (never run) by `mypy --strict` in
tests/test_public_api.py: a public function without annotations, or a call its signature refuses,
fails that test."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import latentcode
from latentcode import (
    ATTENTION_PRESETS,
    CodeFile,
    CodeWriter,
    Embedding,
    InMemoryCodes,
    Intervention,
    LatentcodeError,
    ModelConfig,
    PatchResult,
    Pretrained,
    Recorder,
    Run,
    Site,
    Subject,
    TrainConfig,
    Viewer,
)


def uses_every_public_name(path: Path) -> None:
    config: TrainConfig = latentcode.build_train_config("sraven", "tiny", "hyla")
    run: Run = latentcode.train(config, path / "run")
    model_config: ModelConfig = run.config.model
    model = latentcode.build_model(model_config, seed=0)
    model = latentcode.load_model(path / "run" / "model")
    latentcode.value_network_view(model, layer=0)
    presets: object = ATTENTION_PRESETS
    task = latentcode.get_task("sraven")
    codes = latentcode.extract(run.path, task, sites="sraven-rule", split="ood", n=8)
    memory: CodeFile = codes if isinstance(codes, InMemoryCodes) else CodeFile(codes)
    sites: list[Site] = memory.sites
    table: pd.DataFrame = latentcode.decode(memory, "rule")
    embedding: Embedding = latentcode.embed(memory, "tsne")
    viewer: Viewer = latentcode.build_viewer(memory, embeddings=[embedding])
    effects: pd.DataFrame = latentcode.intervention_effects(run.path, [], n=8)
    result: PatchResult = latentcode.patch(run.path)
    patched: pd.DataFrame = result.table
    pretrained: Pretrained = latentcode.load_pretrained("smollm2", device="cpu", dtype="bfloat16")
    subject: Subject = latentcode.subject_of(run.path)
    n_heads: int = subject.n_heads
    with Recorder(model, "last-self") as recorder, Intervention(model, [], "last-self"):
        model(task.sample(2, "ood").x)
    recorded: dict[Site, object] = dict(recorder.pop())
    writer = CodeWriter(path / "codes.h5", sites, n_heads=4)
    writer.close()
    error: type[Exception] = LatentcodeError
    print(presets, table, viewer, effects, patched, pretrained, n_heads, recorded, error, latentcode.__version__)
