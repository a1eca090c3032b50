"""One writer at a time, no stale locks, no litter, the umask's modes (latentcode.files, CodeWriter)."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from latentcode.errors import LatentcodeError
from latentcode.files import (
    AtomicOutputs,
    ExclusiveLock,
    LockHeld,
    UnsafePath,
    WriteError,
    atomic_write_text,
    lock_path_of,
    process_umask,
)
from latentcode.store import CodeFile, CodeWriter, Site

SITE = Site(0, 1, 1)
REPOSITORY = Path(__file__).resolve().parents[1]

# A writer in its own process: opens the file (taking the lock), says so, waits for "go",
# appends `rows` rows whose codes all equal `tag`, and closes. Exit 3 when refused by the lock.
WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    from latentcode.files import LockHeld
    from latentcode.store import CodeWriter, Site

    path, tag, rows, append, wait, ready, go = sys.argv[1:8]
    try:
        with CodeWriter(path, [Site(0, 1, 1)], 2, {"seed": int(tag)}, append=append == "1",
                        wait_for_lock=float(wait)) as writer:
            Path(ready).touch()
            while not Path(go).exists():
                time.sleep(0.01)
            writer.append(codes={Site(0, 1, 1): np.full((int(rows), 2), float(tag), np.float32)}, split="w" + tag)
    except LockHeld as error:
        print(error)
        sys.exit(3)
""")


def start_writer(path, tag, rows, tmp_path, append=False, wait=0.0, go=None):
    ready = tmp_path / f"ready{tag}"
    go = go or tmp_path / f"go{tag}"
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(tag), str(rows), "1" if append else "0", str(wait),
         str(ready), str(go)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY), "OMP_NUM_THREADS": "1"},
    )
    return process, ready, go


def wait_for(path: Path, process, seconds=60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, f"writer exited early: {process.communicate()}"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def write_rows(path, tag, rows, **options):
    with CodeWriter(path, [SITE], 2, {"seed": tag}, **options) as writer:
        writer.append(codes={SITE: np.full((rows, 2), float(tag), np.float32)}, split=f"w{tag}")


def tags_in(path) -> list[float]:
    return CodeFile(path).codes(SITE)[:, 0].tolist()


# -- concurrent writers --------------------------------------------------------------------------------
def test_second_writer_of_a_new_file_is_refused_naming_the_first_and_no_rows_are_lost(tmp_path):
    path = tmp_path / "codes.h5"
    first, ready, go = start_writer(path, 1, 4, tmp_path)
    wait_for(ready, first)
    second, _, _ = start_writer(path, 2, 4, tmp_path, go=go)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 3, err
    assert f"{path} is being written by pid {first.pid} on {socket.gethostname()} since " in out
    assert "lock file" in out and "--wait-for-lock" in out and len(out.strip().splitlines()) == 1
    go.touch()
    assert first.wait(timeout=60) == 0, first.communicate()
    assert tags_in(path) == [1.0] * 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".h5", ".tmp", ".lock")) == ["codes.h5"]


def test_a_second_appender_that_asks_to_wait_appends_after_the_first(tmp_path):
    """The issue's lost update: two appends at once used to keep only one side's rows."""
    path = tmp_path / "codes.h5"
    write_rows(path, 0, 5)
    first, first_ready, go = start_writer(path, 1, 3, tmp_path, append=True)
    wait_for(first_ready, first)
    second, second_ready, _ = start_writer(path, 2, 2, tmp_path, append=True, wait=60, go=go)
    time.sleep(1.0)
    assert not second_ready.exists() and second.poll() is None, "the second writer must wait for the lock"
    go.touch()
    assert first.wait(timeout=60) == 0, first.communicate()
    assert second.wait(timeout=60) == 0, second.communicate()
    assert tags_in(path) == [0.0] * 5 + [1.0] * 3 + [2.0] * 2
    assert CodeFile(path).split_seeds == {"w0": [0], "w1": [1], "w2": [2]}


@pytest.mark.parametrize("append", [False, True], ids=["new file", "append"])
def test_two_writers_started_together_never_lose_rows(tmp_path, append):
    """Two processes released at the same moment: whatever the order, each either wrote all its
    rows or was refused (lock held, or the file exists by then), and the file holds exactly the
    rows of those that succeeded."""
    path = tmp_path / "codes.h5"
    if append:
        write_rows(path, 0, 5)
    go = tmp_path / "go"
    writers = [start_writer(path, tag, 3, tmp_path, append=append, go=go)[0] for tag in (1, 2)]
    time.sleep(0.5)
    go.touch()
    results = [(writer.wait(timeout=60), writer.communicate()) for writer in writers]
    succeeded = [tag for tag, (code, _) in zip((1, 2), results, strict=True) if code == 0]
    for code, (out, err) in results:
        assert code == 0 or code == 3 or "already exists" in err, (code, out, err)
    assert sorted(tags_in(path)) == sorted([0.0] * 5 * append + [float(tag) for tag in succeeded for _ in range(3)])
    assert len(succeeded) >= 1


# -- stale locks and temporary files ---------------------------------------------------------------------
def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    target = tmp_path / "codes.h5"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from latentcode.files import ExclusiveLock; "
         "lock = ExclusiveLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)", str(target)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LockHeld, match=rf"pid {holder.pid} on "):
        ExclusiveLock(target).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert lock_path_of(target).exists(), "SIGKILL left the sidecar file behind..."
    with ExclusiveLock(target):  # ...but no lock: the kernel dropped it with the process
        pass
    assert not lock_path_of(target).exists()


def test_temporary_files_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    path = tmp_path / "codes.h5"
    writer, ready, _ = start_writer(path, 1, 4, tmp_path)
    wait_for(ready, writer)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=60)
    leftovers = sorted(p.name for p in tmp_path.glob(".codes.h5.*.tmp"))
    assert len(leftovers) == 1
    (tmp_path / ".codes.h5.x.abc.tmp").write_text("a temporary of another file, codes.h5.x")
    write_rows(path, 2, 3)
    assert sorted(p.name for p in tmp_path.glob(".codes.h5.*")) == [".codes.h5.x.abc.tmp"]
    assert tags_in(path) == [2.0] * 3


def test_locks_exclude_each_other_within_one_process_and_wait_when_asked(tmp_path):
    target = tmp_path / "run"
    first = ExclusiveLock(target).acquire()
    with pytest.raises(LockHeld) as refused:
        ExclusiveLock(target).acquire()
    assert isinstance(refused.value, LatentcodeError) and refused.value.holder["pid"] == os.getpid()
    with pytest.raises(LockHeld, match=r"\(waited 0.2 s\)"):
        ExclusiveLock(target, wait=0.2).acquire()
    threading.Timer(0.3, first.release).start()
    started = time.monotonic()
    with ExclusiveLock(target, wait=30):
        assert time.monotonic() - started >= 0.25
    assert list(tmp_path.iterdir()) == []


# -- modes ---------------------------------------------------------------------------------------------
@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_files_and_directories_follow_the_umask_and_existing_modes_are_kept(tmp_path, umask_027):
    assert process_umask() == 0o027
    path = tmp_path / "deeper" / "codes.h5"
    with CodeWriter(path, [SITE], 2) as writer:
        assert mode(writer.temporary_path) == 0o640 and mode(lock_path_of(path)) == 0o640
        writer.append(codes={SITE: np.zeros((2, 2))}, split="a")
    assert mode(path) == 0o640 and mode(path.parent) == 0o750
    os.chmod(path, 0o604)
    write_rows(path, 1, 2, append=True)
    assert mode(path) == 0o604
    write_rows(path, 1, 2, overwrite=True)
    assert mode(path) == 0o604 and len(CodeFile(path)) == 2


def test_a_saved_model_directory_follows_the_umask(tmp_path, umask_027):
    from latentcode.models import ModelConfig, build_model
    from latentcode.models.persistence import save_model

    model = build_model(ModelConfig(n_layers=1, d_model=8, n_heads=2, kqv_dim=4, d_mlp=8, n_ctx=4, d_in=3, d_out=2))
    save_model(model, tmp_path / "model")
    assert mode(tmp_path / "model") == 0o750
    assert {mode(file) for file in (tmp_path / "model").iterdir()} == {0o640}


# -- hostile directories: planted links, devices, FIFOs (issue 23) -------------------------------------
VICTIM_TEXT = "another user's file\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file someone else owns, which a planted link points at; it must never change."""
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    return path


@pytest.mark.parametrize("writer", ["lock", "codes"])
def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path, victim, writer):
    """The lock file used to be opened following links: the victim got truncated to the holder's JSON."""
    target = tmp_path / "codes.h5"
    lock_path_of(target).symlink_to(victim)
    with pytest.raises(UnsafePath, match=rf"lock file {lock_path_of(target)} is a symbolic link"):
        if writer == "lock":
            ExclusiveLock(target).acquire()
        else:
            write_rows(target, 1, 2)
    assert victim.read_text() == VICTIM_TEXT and lock_path_of(target).is_symlink() and not target.exists()


def test_a_lock_file_that_is_a_fifo_or_a_second_name_of_a_file_is_refused(tmp_path, victim):
    target = tmp_path / "codes.h5"
    os.mkfifo(lock_path_of(target))
    with pytest.raises(UnsafePath, match="is a FIFO"):
        ExclusiveLock(target).acquire()
    lock_path_of(target).unlink()
    os.link(victim, lock_path_of(target))  # a hard link: writing the lock would write the victim
    with pytest.raises(UnsafePath, match="a file with 2 hard links"):
        ExclusiveLock(target).acquire()
    assert victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize("mode", ["new", "append", "overwrite"])
@pytest.mark.parametrize("planted", ["link", "dangling link", "fifo", "directory"])
def test_a_codes_file_name_that_is_not_a_regular_file_is_never_written_through_or_replaced(tmp_path, victim, planted,
                                                                                            mode):
    """--append through a link used to replace the link with a file (the target unchanged); a dangling
    link got the new file in its place; --overwrite replaced a device or FIFO with a regular file."""
    path = tmp_path / "codes.h5"
    if planted == "link":
        write_rows(victim.with_name("real.h5"), 1, 2)
        path.symlink_to(victim.with_name("real.h5"))
    elif planted == "dangling link":
        path.symlink_to(tmp_path / "elsewhere" / "nothing.h5")
    elif planted == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UnsafePath, match=rf"{path} is a "):
        write_rows(path, 2, 2, append=mode == "append", overwrite=mode == "overwrite")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path / "elsewhere" / "nothing.h5").exists()
    if planted == "link":
        assert path.is_symlink() and tags_in(victim.with_name("real.h5")) == [1.0, 1.0]


def test_outputs_are_written_as_a_set_never_through_a_link_and_a_failure_leaves_nothing(tmp_path, victim):
    table, figure = tmp_path / "out.csv", tmp_path / "out.png"
    (tmp_path / "out.json").symlink_to(victim)
    with pytest.raises(UnsafePath, match="out.json is a symbolic link"):
        with AtomicOutputs(lock=tmp_path / "out") as outputs:
            outputs.write_text(table, "a,b\n")
            outputs.write_text(tmp_path / "out.json", "{}")
    assert victim.read_text() == VICTIM_TEXT and sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out.json"]
    with pytest.raises(RuntimeError):
        with AtomicOutputs(lock=tmp_path / "out") as outputs:
            outputs.write_text(table, "a,b\n")
            raise RuntimeError("the figure failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out.json"]
    with AtomicOutputs(lock=tmp_path / "out") as outputs:
        outputs.write_text(table, "a,b\n")
        outputs.write_bytes(figure, b"png")
    assert outputs.written == [table, figure] and table.read_text() == "a,b\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out.csv", "out.json", "out.png"]


def test_tables_and_figures_have_one_writer_that_round_trips_and_never_follows_a_link(tmp_path, victim):
    """AtomicOutputs.write_table / write_figure: the one writer of every command's tables and figures."""
    import pandas as pd
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    table = pd.DataFrame({"model": ["hyla", "softmax"], "layer": [0, 1], "value": [0.25, 0.5]})
    figure = Figure(figsize=(2, 1), dpi=50)
    FigureCanvasAgg(figure)
    figure.subplots().plot([0, 1], [1, 0])
    stem = tmp_path / "out" / "rule"
    with AtomicOutputs(lock=stem) as outputs:
        outputs.write_table(stem, table)
        outputs.write_figure(stem, figure, formats=("png", "svg"))
    assert outputs.written == [stem.with_name(f"rule.{suffix}") for suffix in ("csv", "json", "png", "svg")]
    assert (tmp_path / "out" / "rule.csv").read_text() == "model,layer,value\nhyla,0,0.25\nsoftmax,1,0.5\n"
    assert json.loads((tmp_path / "out" / "rule.json").read_text()) == table.to_dict(orient="records")
    assert (tmp_path / "out" / "rule.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "out" / "rule.png").stat().st_size > 0 and "<svg" in (tmp_path / "out" / "rule.svg").read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rule.csv", "rule.json", "rule.png", "rule.svg"]
    (tmp_path / "out" / "rule.png").unlink()
    (tmp_path / "out" / "rule.png").symlink_to(victim)
    with pytest.raises(UnsafePath, match="rule.png is a symbolic link"), AtomicOutputs(lock=stem) as outputs:
        outputs.write_table(stem, table.iloc[:1])
        outputs.write_figure(stem, figure)
    assert victim.read_text() == VICTIM_TEXT and len(pd.read_csv(tmp_path / "out" / "rule.csv")) == 2


def test_sets_of_one_lock_nested_in_one_thread_join_the_enclosing_set(tmp_path):
    """One command's outputs from several writers (probe: write_table, then plot_probe_scores, each
    with its own set of the stem's lock) are all or none; the lock is not reentrant, so they join."""
    stem = tmp_path / "out"
    with pytest.raises(RuntimeError, match="drawing failed"):
        with AtomicOutputs(lock=stem):
            with AtomicOutputs(lock=stem) as table:
                table.write_text(tmp_path / "out.csv", "a,b\n")
            assert table.written == [tmp_path / "out.csv"] and not (tmp_path / "out.csv").exists()
            raise RuntimeError("drawing failed")
    assert list(tmp_path.iterdir()) == []
    with AtomicOutputs(lock=stem) as command:
        with AtomicOutputs(lock=stem) as table:
            table.write_text(tmp_path / "out.csv", "a,b\n")
        with pytest.raises(ValueError), AtomicOutputs(lock=stem) as figure:  # a failed writer's files leave the set
            figure.write_bytes(tmp_path / "out.png", b"half")
            raise ValueError("caught by the command")
        other_thread = []
        thread = threading.Thread(target=lambda: other_thread.append(pytest.raises(LockHeld, AtomicOutputs(lock=stem).__enter__)))
        thread.start()
        thread.join()
        assert other_thread, "another thread does not join: it is refused"
    assert command.written == [tmp_path / "out.csv"] and sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_fixed_temporary_names_are_gone_a_planted_one_is_not_followed(tmp_path, victim):
    """Run directories wrote `.config.json.tmp` and `.metrics.jsonl.tmp`, the report `.NAME.tmp`:
    a link planted under such a name got the content written into the victim."""
    from latentcode.rundir import RunDirectory

    directory = RunDirectory(tmp_path / "run")
    directory.path.mkdir()
    (directory.path / ".config.json.tmp").symlink_to(victim)
    directory.create({"train": {"task": {"name": "fuzzy_logic"}, "model": {}}})
    for name in (".metrics.jsonl.tmp", ".summary.json.tmp"):
        (directory.path / name).symlink_to(victim)
    directory.append_metrics({"event": "train", "step": 1, "loss": 0.5})
    directory.append_metrics({"event": "train", "step": 2, "loss": 0.4})
    directory.truncate_metrics(1)
    directory.write_summary({"final_metrics": {}})
    assert victim.read_text() == VICTIM_TEXT
    assert [record["step"] for record in directory.read_metrics()] == [1]
    directory.metrics_path.unlink()
    directory.metrics_path.symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        directory.append_metrics({"event": "train", "step": 3, "loss": 0.3})
    assert victim.read_text() == VICTIM_TEXT
    atomic_write_text(tmp_path / "report.html", "<html></html>")
    assert (tmp_path / "report.html").read_text() == "<html></html>"


def test_write_errors_are_one_line_and_leave_nothing(tmp_path):
    long_name = tmp_path / ("x" * 250 + ".h5")  # its lock and temporary names pass the 255-byte limit
    with pytest.raises(WriteError, match=r"cannot write .*: File name too long"):
        write_rows(long_name, 1, 2)
    with pytest.raises(WriteError, match="Is a directory|Not a directory"):
        with AtomicOutputs() as outputs:
            outputs.write_text(tmp_path / "a_file" / "x.csv", "")  # a file where a directory is needed
            (tmp_path / "a_file").write_text("")
    assert sorted(p.name for p in tmp_path.iterdir()) in (["a_file"], [])


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs (needs root and CAP_SYS_ADMIN); skipped where it cannot be mounted."""
    place = tmp_path / "small"
    place.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(place)],
                                           capture_output=True).returncode:
        pytest.skip("needs mount (root, CAP_SYS_ADMIN) for a small file system")
    yield place
    subprocess.run(["umount", str(place)], check=True)


def test_a_full_disk_is_a_one_line_error_and_the_previous_outputs_stay_whole(full_disk):
    path = full_disk / "codes.h5"
    write_rows(path, 1, 2)
    before = path.read_bytes()
    with pytest.raises(WriteError, match=rf"cannot write {path}"):
        with CodeWriter(path, [SITE], 2, append=True) as writer:
            for _ in range(20):
                writer.append(codes={SITE: np.random.default_rng(0).normal(size=(4096, 2))}, split="big")
            writer.flush()
    assert path.read_bytes() == before and sorted(p.name for p in full_disk.iterdir()) == ["codes.h5"]
    (full_disk / "table.csv").write_text("old\n")
    with pytest.raises(WriteError, match="No space left on device"):
        with AtomicOutputs(lock=full_disk / "table") as outputs:
            outputs.write_bytes(full_disk / "table.csv", b"x" * 2**20)
    assert (full_disk / "table.csv").read_text() == "old\n"
    assert sorted(p.name for p in full_disk.iterdir()) == ["codes.h5", "table.csv"]
