"""Checkpoints hold no pickles, planted ones are refused unrun, and a run killed at any line of the
trainer's writing code resumes to the uninterrupted run's weights, metrics rows and summary.

A kill is simulated in-process: a trace function raises `Killed` (a BaseException, which nothing in
the trainer catches) at a chosen line event of the trainer, checkpoint, run-directory or model-saving
code. Events are classified into phases by the function they happen in and by what the run
directory holds at that moment.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from safetensors.torch import load_file, save_file

import latentcode.models.persistence as persistence
import latentcode.rundir as rundir
import latentcode.training.checkpoint as checkpoint
import latentcode.training.trainer as trainer
from latentcode.rundir import RunDirectoryError
from latentcode.training import CheckpointError, Run, build_train_config, train
from latentcode.training.checkpoint import optimizer_from_files, optimizer_to_files, pickle_files
from tests.training.conftest import SMALL_MODEL

# -- planted pickles ------------------------------------------------------------------------------


class Planted:
    """Unpickling this creates the marker file: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_unpickling_the_planted_object_runs_its_code(tmp_path):
    """The control for the tests below: this object does run code when unpickled."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Planted(marker)))
    assert marker.exists()


def write_torch_save(path: Path, marker: Path) -> None:
    torch.save({"planted": Planted(marker)}, path)


def write_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(Planted(marker)))


@pytest.mark.parametrize("name, writer", [
    ("custom_checkpoint_0.pkl", write_torch_save),  # where accelerate's load_state unpickled it
    ("random_states_0.pkl", write_pickle),
    ("optimizer.bin", write_torch_save),
    ("optimizer.safetensors", write_pickle),  # a pickle under a safe name is found by its bytes
    ("notes.dat", write_torch_save),  # a torch.save zip under any name
])
def test_a_planted_pickle_is_refused_and_never_runs(tmp_path, small_config, name, writer):
    config = small_config(n_train_instances=6 * 32, batch_size=32, checkpoint_every=2)
    train(config, tmp_path / "run", progress=False, stop_after_step=3)
    marker = tmp_path / "ran"
    writer(tmp_path / "run" / "checkpoints" / "step_00000002" / name, marker)
    with pytest.raises(CheckpointError, match=rf"pickle-based files \(checkpoints/step_00000002/{name}\)"):
        train(resume=tmp_path / "run", progress=False)
    assert not marker.exists(), "the planted pickle ran"
    assert not (tmp_path / "run" / "model").exists()


def test_a_run_writes_only_safetensors_and_json_and_resumes_without_unpickling(tmp_path, small_config,
                                                                               monkeypatch):
    config = small_config(n_train_instances=6 * 32, batch_size=32, checkpoint_every=2)
    train(config, tmp_path / "run", progress=False, stop_after_step=5)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert {p.suffix for p in files} == {".json", ".jsonl", ".safetensors"}
    assert pickle_files(tmp_path / "run") == []

    def refuse(*args, **kwargs):
        raise AssertionError("resume unpickled something")

    for module, name in [(pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")]:
        monkeypatch.setattr(module, name, refuse)
    run = train(resume=tmp_path / "run", progress=False)
    assert run.summary["resumed_from_step"] == 4


# -- what a checkpoint holds -----------------------------------------------------------------------


def adamw_after_steps(seed: int, steps: int) -> tuple[torch.nn.Module, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW([{"params": model[0].parameters(), "weight_decay": 0.1},
                                   {"params": model[2].parameters(), "weight_decay": 0.0}], lr=1e-2)
    for step in range(steps):
        model(torch.randn(8, 5, generator=torch.Generator().manual_seed(step))).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_optimizer_state_survives_safetensors_and_json_bit_exactly(tmp_path):
    model, optimizer = adamw_after_steps(seed=1, steps=3)
    tensors, structure = optimizer_to_files(optimizer)
    save_file(tensors, tmp_path / "optimizer.safetensors")
    (tmp_path / "optimizer.json").write_text(json.dumps(structure))

    twin, twin_optimizer = adamw_after_steps(seed=2, steps=1)  # other weights and moments
    twin.load_state_dict(model.state_dict())
    optimizer_from_files(twin_optimizer, load_file(tmp_path / "optimizer.safetensors"),
                         json.loads((tmp_path / "optimizer.json").read_text()))
    original, loaded = optimizer.state_dict(), twin_optimizer.state_dict()
    assert original["param_groups"] == loaded["param_groups"]
    for index, entries in original["state"].items():
        for name, tensor in entries.items():
            assert torch.equal(tensor, loaded["state"][index][name]), (index, name)
    # ...and both take the same next step, to the bit.
    for net, opt in [(model, optimizer), (twin, twin_optimizer)]:
        net(torch.ones(3, 5)).sum().backward()
        opt.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


def test_grad_scaler_and_scheduler_state_round_trip(tmp_path):
    from latentcode.training.schedule import build_scheduler

    model, optimizer = adamw_after_steps(seed=1, steps=2)
    scheduler = build_scheduler(optimizer, warmup_steps=1, total_steps=10)
    optimizer.step()  # no gradients, so no change; the scheduler expects a step before its own
    scheduler.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    scaler.scale(torch.ones(()))
    scaler.update(512.0)
    loop = checkpoint.LoopState(2, {"test": {"loss": 0.5}}, [0.25, 0.125], 64, 1.5, 3.0)
    checkpoint.save_checkpoint(tmp_path / "ck", model, optimizer, scheduler, scaler, loop)

    twin, twin_optimizer = adamw_after_steps(seed=2, steps=1)
    twin_scheduler = build_scheduler(twin_optimizer, warmup_steps=1, total_steps=10)
    twin_scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=7)
    assert checkpoint.load_checkpoint(tmp_path / "ck", twin, twin_optimizer, twin_scheduler, twin_scaler) == loop
    assert twin_scaler.get_scale() == 512.0
    assert twin_scheduler.state_dict() == scheduler.state_dict()
    assert twin_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def tamper_state(key: str, value):
    def edit(path: Path) -> None:
        state = json.loads((path / "trainer_state.json").read_text())
        target = state
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
        (path / "trainer_state.json").write_text(json.dumps(state))
    return edit


def wrong_optimizer_shape(path: Path) -> None:
    tensors = load_file(path / "optimizer.safetensors")
    tensors["state.0.exp_avg"] = torch.zeros(3, 3)
    save_file(tensors, path / "optimizer.safetensors")


@pytest.mark.parametrize("tamper, complaint", [
    (tamper_state("scheduler.optimizer", "anything"), r"scheduler has keys"),
    (tamper_state("scheduler.last_epoch", "10"), r"scheduler.last_epoch is '10'"),
    (tamper_state("optimizer.param_groups", []), r"optimizer.param_groups has 0 entries, expected 2"),
    (tamper_state("loop.last_eval", {"test": {"loss": "low"}}), r"loop.last_eval is"),
    (tamper_state("format", None), r"format None, expected 'latentcode-checkpoint/2'"),
    (wrong_optimizer_shape, r"optimizer tensor 'state.0.exp_avg' has shape \[3, 3\]"),
])
def test_a_tampered_checkpoint_is_refused_naming_what_is_wrong(tmp_path, small_config, tamper, complaint):
    config = small_config(n_train_instances=6 * 32, batch_size=32, checkpoint_every=2)
    train(config, tmp_path / "run", progress=False, stop_after_step=3)
    tamper(tmp_path / "run" / "checkpoints" / "step_00000002")
    with pytest.raises(CheckpointError, match=r"cannot load checkpoint .*step_00000002.*" + complaint) as caught:
        train(resume=tmp_path / "run", progress=False)
    assert "\n" not in str(caught.value)


# -- metrics.jsonl ---------------------------------------------------------------------------------


def test_a_torn_last_metrics_line_is_dropped_on_resume_and_named_by_readers(tmp_path, small_config):
    config = small_config(n_train_instances=6 * 32, batch_size=32, checkpoint_every=2, log_every=1)
    train(config, tmp_path / "run", progress=False, stop_after_step=3)
    metrics = tmp_path / "run" / "metrics.jsonl"
    with metrics.open("a") as file:
        file.write('{"event": "train", "loss": 0.1')  # killed while appending
    # line 1: the session's compute settings, lines 2-4: steps 1-3, line 5: torn
    with pytest.raises(RunDirectoryError, match=rf"{metrics} line 5 is not valid JSON"):
        Run(tmp_path / "run").metrics()
    run = train(resume=tmp_path / "run", progress=False)
    assert [r["step"] for r in run.metrics("train")] == [1, 2, 3, 4, 5, 6]

    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(RunDirectoryError, match=rf"{metrics} line 2 is not valid JSON"):
        Run(tmp_path / "run").metrics()


# -- killing at every phase ------------------------------------------------------------------------


class Killed(BaseException):
    """Stands for SIGKILL: the trainer catches Exceptions only, so nothing handles it."""


TRACED_FILES = {module.__file__ for module in (trainer, checkpoint, rundir, persistence)}
# The function an event happens in (or is called from) names its phase; other events are phased
# by what the run directory holds.
PHASE_OF_FUNCTION = {
    "create": "creating the run directory",
    "_load_latest_checkpoint": "resuming",
    "truncate_metrics": "resuming",
    "append_metrics": "appending to metrics.jsonl",
    "_save_checkpoint": "writing a checkpoint",
    "save_model": "writing model/",
    "write_summary": "writing summary.json",
}


class Event(NamedTuple):
    phase: str
    function: str
    line: int
    checkpoints: int  # complete checkpoints in the run directory at that moment


def phase_of(frame, run_dir: Path, final_step: int) -> str:
    caller = frame
    while caller is not None and caller.f_code.co_name != "train":
        if caller.f_code.co_name in PHASE_OF_FUNCTION:
            return PHASE_OF_FUNCTION[caller.f_code.co_name]
        caller = caller.f_back
    directory = rundir.RunDirectory(run_dir)
    if not directory.config_path.exists():
        return "before the run directory exists"
    if directory.is_finished:
        return "after summary.json"
    if directory.model_path.exists():
        return "after model/, before summary.json"
    if directory.checkpoint_path(final_step).exists():
        return "after the last checkpoint, before model/"
    if directory.checkpoints():
        return "training after a checkpoint"
    return "training before the first checkpoint"


@contextmanager
def line_events(on_line):
    """Call on_line(frame) at every line executed in TRACED_FILES."""

    def local(frame, event, arg):
        if event == "line":
            on_line(frame)
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename in TRACED_FILES else None

    sys.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(None)


def events_of(run, run_dir: Path, final_step: int) -> list[Event]:
    """Run `run()` and list its line events."""
    events = []
    with line_events(lambda frame: events.append(Event(
            phase_of(frame, run_dir, final_step), frame.f_code.co_name, frame.f_lineno,
            len(rundir.RunDirectory(run_dir).checkpoints())))):
        run()
    return events


def killed_at(run, index: int, expected: Event) -> None:
    """Run `run()` and kill it at its line event number `index`."""
    seen = [0]

    def on_line(frame):
        if seen[0] == index:
            assert (frame.f_code.co_name, frame.f_lineno) == expected[1:3], "the run took another path"
            raise Killed(expected)
        seen[0] += 1

    with pytest.raises(Killed), line_events(on_line):
        run()


def kill_config(small_config):
    # 6 steps; checkpoints at 2, 4, 6 with a logging interval open at 2; evaluations at 3 and 6.
    return small_config(n_train_instances=6 * 32, batch_size=32, checkpoint_every=2, eval_every=3,
                        log_every=4, eval_instances=64, keep_checkpoints=2)


def continue_run(config, run_dir: Path) -> Run:
    """What a user does after a kill: resume, or start again if the run directory never came to be."""
    if rundir.RunDirectory(run_dir).is_finished:
        return Run(run_dir)
    if rundir.RunDirectory(run_dir).config_path.exists():
        return train(resume=run_dir, progress=False)
    return train(config, run_dir, progress=False)


def assert_same_run(reference: Run, resumed: Run) -> None:
    """Same weights to the bit, the same logged rows, the same final metrics and a complete summary."""
    for (name, p), q in zip(reference.load_model().named_parameters(), resumed.load_model().parameters(),
                            strict=True):
        assert torch.equal(p, q), name
    rows = [(r["step"], r["loss"], r["lr"]) for r in reference.metrics("train")]
    assert [(r["step"], r["loss"], r["lr"]) for r in resumed.metrics("train")] == rows
    assert resumed.metrics("eval") == reference.metrics("eval")
    assert resumed.summary.keys() == reference.summary.keys()
    assert resumed.final_metrics == reference.final_metrics and resumed.final_metrics
    for key in ("steps", "instances", "processes"):
        assert resumed.summary[key] == reference.summary[key]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """The uninterrupted run, traced: its line events are the kill points."""
    config = kill_config(lambda **overrides: build_train_config("fuzzy_logic", "tiny", "hyla",
                                                                **{**SMALL_MODEL, **overrides}))
    root = tmp_path_factory.mktemp("kills")
    events = events_of(lambda: train(config, root / "whole", progress=False), root / "whole", config.steps)
    return config, root, Run(root / "whole"), events


def kill_and_continue(campaign, index: int, where: Path) -> Run:
    config, _, _, events = campaign
    killed_at(lambda: train(config, where, progress=False), index, events[index])
    return continue_run(config, where)


KILL_PHASES = [
    "before the run directory exists",
    "creating the run directory",
    "training before the first checkpoint",
    "appending to metrics.jsonl",
    "writing a checkpoint",
    "training after a checkpoint",
    "after the last checkpoint, before model/",
    "writing model/",
    "after model/, before summary.json",
    "writing summary.json",
    "after summary.json",
]


WRITING_PHASES = {"creating the run directory", "appending to metrics.jsonl", "writing a checkpoint",
                  "writing model/", "writing summary.json"}


def test_the_campaign_reaches_every_phase(campaign):
    assert {event.phase for event in campaign[3]} == set(KILL_PHASES)


@pytest.mark.parametrize("phase", KILL_PHASES)
@pytest.mark.parametrize("moment", ["middle", "last line"])
def test_a_run_killed_in_any_phase_resumes_to_the_uninterrupted_run(campaign, tmp_path, phase, moment):
    _, _, reference, events = campaign
    indices = [i for i, event in enumerate(events) if event.phase == phase]
    index = indices[len(indices) // 2] if moment == "middle" else indices[-1]
    assert_same_run(reference, kill_and_continue(campaign, index, tmp_path / "run"))


def test_a_run_killed_after_model_before_summary_resumes(campaign, tmp_path):
    """The kill the issue names: model/ is written, summary.json is not."""
    _, _, reference, events = campaign
    index = next(i for i, event in enumerate(events) if event[0] == "after model/, before summary.json")
    killed_at(lambda: train(campaign[0], tmp_path / "run", progress=False), index, events[index])
    assert (tmp_path / "run" / "model").is_dir() and not (tmp_path / "run" / "summary.json").exists()
    resumed = train(resume=tmp_path / "run", progress=False)
    assert resumed.summary["resumed_from_step"] == 6
    assert_same_run(reference, resumed)


def resume_events_of(campaign, root: Path) -> tuple[Path, list[Event]]:
    """A run killed after its first checkpoint, kept in root/killed, and the line events of its resume."""
    config, _, _, events = campaign
    index = next(i for i, event in enumerate(events) if event.phase == "training after a checkpoint")
    killed_at(lambda: train(config, root / "killed", progress=False), index, events[index])
    shutil.copytree(root / "killed", root / "resumed")
    return root / "killed", events_of(lambda: train(resume=root / "resumed", progress=False), root / "resumed",
                                      config.steps)


def kill_resume_and_continue(campaign, killed: Path, index: int, event: Event, where: Path) -> Run:
    shutil.copytree(killed, where)
    killed_at(lambda: train(resume=where, progress=False), index, event)
    return continue_run(campaign[0], where)


def test_a_resume_killed_while_resuming_resumes_again(campaign, tmp_path):
    killed, resume_events = resume_events_of(campaign, tmp_path)
    index = [i for i, event in enumerate(resume_events) if event.phase == "resuming"][-1]
    resumed = kill_resume_and_continue(campaign, killed, index, resume_events[index], tmp_path / "run")
    assert_same_run(campaign[2], resumed)


@pytest.mark.slow
def test_every_kill_point_resumes_to_the_uninterrupted_run(campaign, tmp_path, capsys):
    """Kill at every distinct line event of a 6-step run where something is being written (a line
    counts once per phase, before and after the first complete checkpoint; the lines that prune a
    checkpoint run only from the third on and are killed too), and at the first line of every
    function of the phases where nothing is written (a kill there leaves the files as the previous
    write left them, whichever line it hits). Fewer kills than one per line and checkpoint count,
    for CI's time. Continue each, and print how many of each phase came out equal to the
    uninterrupted run."""
    _, _, reference, events = campaign
    first_of_each = {}
    for index, event in enumerate(events):
        key = (event._replace(checkpoints=min(event.checkpoints, 1)) if event.phase in WRITING_PHASES
               else (event.phase, event.function))
        first_of_each.setdefault(key, index)
    outcomes: dict[str, list[bool]] = defaultdict(list)
    failures = []
    for index in first_of_each.values():
        event, where = events[index], tmp_path / f"kill-{index}"
        try:
            assert_same_run(reference, kill_and_continue(campaign, index, where))
            outcomes[event.phase].append(True)
        except Exception as error:  # noqa: BLE001 -- collected and reported below
            outcomes[event.phase].append(False)
            failures.append(f"{event}: {type(error).__name__}: {' '.join(str(error).split())[:300]}")
        shutil.rmtree(where, ignore_errors=True)
    with capsys.disabled():
        print()
        for phase in KILL_PHASES:
            results = outcomes[phase]
            print(f"{phase}: {sum(results)} of {len(results)} kill points resume to the uninterrupted run")
        print("\n".join(failures))
    assert not failures, failures[:5]


@pytest.mark.slow
def test_every_kill_point_of_a_resume_resumes_again(campaign, tmp_path, capsys):
    """Kill a resume at every distinct line while it loads its checkpoint and trims metrics.jsonl."""
    killed, resume_events = resume_events_of(campaign, tmp_path)
    first_of_each = {}
    for index, event in enumerate(resume_events):
        if event.phase == "resuming":
            first_of_each.setdefault(event, index)
    failures = []
    for event, index in first_of_each.items():
        where = tmp_path / f"kill-{index}"
        try:
            assert_same_run(campaign[2], kill_resume_and_continue(campaign, killed, index, event, where))
        except Exception as error:  # noqa: BLE001 -- collected and reported below
            failures.append(f"{event}: {type(error).__name__}: {' '.join(str(error).split())[:300]}")
        shutil.rmtree(where, ignore_errors=True)
    with capsys.disabled():
        print(f"\nresuming: {len(first_of_each) - len(failures)} of {len(first_of_each)} kill points resume again")
    assert not failures, failures[:5]


# -- a config edited between sessions (issue 23) ---------------------------------------------------------
MODELS = Path(__file__).resolve().parents[2] / "models"


def test_a_checkpoint_records_the_config_the_run_started_with(tmp_path):
    from latentcode.training.schedule import build_scheduler

    model, optimizer = adamw_after_steps(0, 1)
    scheduler = build_scheduler(optimizer, 0, 10, 0.1)
    started_with = {"learning_rate": 0.001, "model": {"attention": "hyla"}}
    checkpoint.save_checkpoint(tmp_path / "step", model, optimizer, scheduler, None, checkpoint.LoopState(step=1),
                               started_with)
    assert checkpoint.recorded_train_config(tmp_path / "step") == started_with


def test_a_resume_refuses_a_config_edited_since_the_run_started_naming_the_keys(tmp_path, capsys):
    """Editing learning_rate in config.json before --resume was silently ignored by the restored
    optimizer while the file recorded the new value."""
    from latentcode.cli import main

    run = tmp_path / "run"
    shutil.copytree(MODELS / "fuzzy_logic-hyla", run, ignore=shutil.ignore_patterns("*.md", "summary.json"))
    config = json.loads((run / "config.json").read_text())
    state = run / "checkpoints" / "step_00000010"
    state.mkdir(parents=True)
    (state / "trainer_state.json").write_text(json.dumps(
        {"format": checkpoint.CHECKPOINT_FORMAT, "step": 10, "train_config": config["train"]}))
    learning_rate = config["train"]["learning_rate"]
    config["train"]["learning_rate"] = 0.5
    config["train"]["task"]["frac_test"] = 0.5
    (run / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(run)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{run / 'config.json'} was changed since the run started (" in error
    assert f"learning_rate: {learning_rate!r} -> 0.5" in error and "task.frac_test: 0.7 -> 0.5" in error
    assert sorted(path.name for path in run.iterdir()) == ["checkpoints", "config.json", "metrics.jsonl", "model"]
