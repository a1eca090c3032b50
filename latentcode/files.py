"""Files that several processes may write: one writer at a time, the process umask, no litter.

A writer of a codes file or of a run directory holds an exclusive lock on a sidecar file beside it,
`.NAME.lock`, from before it looks at the target until its last rename. The lock is
`fcntl.flock`: the kernel drops it when the holding process ends, however it ends (SIGKILL, a
crash, a lost machine), so a stale lock cannot exist by construction; a sidecar file left behind
by a killed writer holds no lock and is taken over by the next one. The holder writes its pid, host
and start time into the sidecar, so a second writer is refused with one line naming them; it waits
for the lock only when asked (`wait` seconds).

Temporary files of a target are named `.NAME.<random>.tmp`; as only the lock holder writes them,
any found by the next lock holder belong to a dead writer and are removed.

New files and directories get the usual modes under the process umask (0644 and 0755 under umask
022), not tempfile's private 0600 and 0700.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError

try:
    import fcntl
except ImportError:  # Windows: no flock; the maintained `filelock` package does the locking there
    fcntl = None


class LockHeld(LatentcodeError):
    """Another process is writing the same codes file or run directory."""

    def __init__(self, target: Path, lock_path: Path, holder: dict[str, Any] | None, waited: float, hint: str):
        if holder:
            who = f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
            if holder.get("purpose"):
                who += f" ({holder['purpose']})"
        else:
            who = "another process"
        waited_text = f" (waited {waited:g} s)" if waited else ""
        super().__init__(f"{target} is being written by {who}{waited_text}; lock file {lock_path}; {hint}")
        self.target, self.lock_path, self.holder = target, lock_path, holder


def lock_path_of(target: str | Path) -> Path:
    """The sidecar lock file of `target`: `.NAME.lock` in the same directory."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


class ExclusiveLock:
    """An exclusive, non-reentrant lock on `target` held through its sidecar `.NAME.lock`.

    >>> with ExclusiveLock("codes.h5", purpose="extract"):
    ...     ...  # the only writer of codes.h5

    wait: seconds to wait for another holder to finish (0: refuse at once, None: wait forever).
    Two ExclusiveLock objects exclude each other even within one process.
    """

    POLL_SECONDS = 0.05

    def __init__(self, target: str | Path, *, wait: float | None = 0.0, purpose: str = "",
                 hint: str = "wait until it has finished or choose another path"):
        self.target = Path(target)
        self.path = lock_path_of(self.target)
        self.wait = wait
        self.purpose = purpose
        self.hint = hint
        self._descriptor: int | None = None
        self._fallback = None

    @property
    def held(self) -> bool:
        return self._descriptor is not None or self._fallback is not None

    def acquire(self) -> ExclusiveLock:
        if self.held:
            raise RuntimeError(f"{self.path} is already held by this ExclusiveLock")
        if fcntl is None:
            return self._acquire_with_filelock()
        started = time.monotonic()
        while True:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(descriptor)
                os.close(descriptor)
                waited = time.monotonic() - started
                if self.wait is not None and waited >= self.wait:
                    raise LockHeld(self.target, self.path, holder, self.wait, self.hint) from None
                time.sleep(self.POLL_SECONDS)
                continue
            except BaseException:
                os.close(descriptor)
                raise
            # The previous holder unlinks the sidecar before unlocking it: if that happened between
            # our open and our flock, we locked a file nobody else will ever see; start over.
            if _same_file(descriptor, self.path):
                break
            os.close(descriptor)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                  "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
        self._descriptor = descriptor
        return self

    def release(self) -> None:
        if self._fallback is not None:
            self._fallback.release()
            self._fallback = None
            return
        if self._descriptor is None:
            return
        descriptor, self._descriptor = self._descriptor, None
        try:
            # Unlinked while still held, so that no other writer can lock this inode afterwards and
            # believe it holds the lock (see the check in acquire).
            if _same_file(descriptor, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            os.close(descriptor)

    def _acquire_with_filelock(self) -> ExclusiveLock:
        import filelock

        lock = filelock.FileLock(str(self.path), timeout=-1 if self.wait is None else self.wait)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise LockHeld(self.target, self.path, None, self.wait or 0, self.hint) from None
        self._fallback = lock
        return self

    def __enter__(self) -> ExclusiveLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

    def __del__(self) -> None:
        # A lock object dropped without release (an exception in a constructor) still lets go.
        if getattr(self, "_descriptor", None) is not None:
            try:
                self.release()
            except Exception:  # noqa: BLE001 - at interpreter exit modules may be gone; the kernel lets go
                pass


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (opened.st_dev, opened.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _read_holder(descriptor: int) -> dict[str, Any] | None:
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0).decode() or "null")
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


# -- temporary files ---------------------------------------------------------------------------------
def _temporary_pattern(target: Path) -> re.Pattern[str]:
    # The random part holds no dot, so another target's temporaries (".NAME.x.<random>.tmp") never match.
    return re.compile(rf"^\.{re.escape(target.name)}\.[^./]+\.tmp$")


def new_temporary_file(target: str | Path) -> Path:
    """Create an empty `.NAME.<random>.tmp` beside `target`, with the mode a new file gets under the
    process umask (tempfile.mkstemp would make it 0600, and the rename would keep that)."""
    target = Path(target)
    for _ in range(100):
        candidate = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        os.close(descriptor)
        return candidate
    raise FileExistsError(f"could not create a temporary file beside {target}")


def remove_dead_temporaries(target: str | Path) -> list[Path]:
    """Remove temporary files of `target` left by killed writers; call only while holding its lock."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    pattern = _temporary_pattern(target)
    removed = []
    for path in target.parent.iterdir():
        if pattern.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


# -- modes -------------------------------------------------------------------------------------------
def process_umask() -> int:
    """The process umask, read without changing it where the system allows (Linux 4.7+)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)  # elsewhere: set and restore (a brief window for other threads)
    os.umask(umask)
    return umask


def give_umask_mode(path: str | Path, directory: bool = False) -> None:
    """chmod `path` to what a newly created file (0666) or directory (0777) gets under the umask."""
    os.chmod(path, (0o777 if directory else 0o666) & ~process_umask())
