"""One writer at a time, no stale locks, no litter, the umask's modes (latentcode.files, CodeWriter)."""

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
from latentcode.files import ExclusiveLock, LockHeld, lock_path_of, process_umask
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
