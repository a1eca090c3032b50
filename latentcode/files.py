"""Files that several processes may write: one writer at a time, the process umask, no litter.

A writer holds `fcntl.flock` on a sidecar `.NAME.lock` beside its target (`ExclusiveLock`) from before it
looks at the target until its last rename: the kernel drops the lock when its process ends, however it
ends, so a stale lock cannot exist, and the holder's pid, host and start time in the sidecar name it to a
second writer. Temporaries `.NAME.<random>.tmp` found by the next holder are a dead writer's and are
removed. Nothing here follows a symbolic link (`O_NOFOLLOW`, `O_EXCL`, `check_replaceable`), so a second
user who can write in the directory cannot redirect a write; an `OSError` becomes a one-line `WriteError`
and leaves no half-written file. New files and directories get the usual modes under the process umask
(0644 and 0755 under umask 022), not tempfile's private 0600 and 0700.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import errno
import json
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError

try:
    import fcntl
except ImportError:  # Windows: no flock; the maintained `filelock` package does the locking there
    fcntl = None


class UnsafePath(LatentcodeError, ValueError):
    """Not a regular file where one is written (a link, a directory, a device, a FIFO, a socket): never followed or
    replaced."""


class WriteError(LatentcodeError, OSError):
    """Writing a file failed (no space left, a name too long, ...): says which and why; nothing half-written is left."""


def write_error(error: BaseException, path: str | Path) -> WriteError:
    """The one-line user error for an OSError (or HDF5's RuntimeError) raised while writing `path`."""
    if isinstance(error, LatentcodeError):
        return error
    reason = getattr(error, "strerror", None) or str(error)
    # HDF5 wraps the system's reason in several lines: "... error message = 'No space left on device' ..."
    system = re.search(r"error message = '([^']*)'", reason)
    reason = system.group(1) if system else " ".join(reason.split())[:200]
    return WriteError(f"cannot write {path}: {reason}")


def kind_of(mode: int) -> str:
    """What a file of `st_mode` is, in words: "a symbolic link", "a directory", ..."""
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def check_replaceable(target: str | Path, what: str = "") -> None:
    """Refuse a `target` that exists and is not a regular file: writing would follow a symbolic
    link (into another user's file) or replace a link, directory, device or FIFO with a file."""
    target = Path(target)
    try:
        info = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there to follow or replace (a file on the way is the writer's to report)
    except OSError as error:
        raise write_error(error, target) from None
    if not stat.S_ISREG(info.st_mode):
        extra = f" -> {os.readlink(target)}" if stat.S_ISLNK(info.st_mode) else ""
        raise UnsafePath(f"{what + ' ' if what else ''}{target} is {kind_of(info.st_mode)}{extra}; latentcode "
                         "writes only regular files and never follows or replaces anything else; remove it or "
                         "choose another path")


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
            # A regular file with one name: a planted `.NAME.lock` pointing at another file never gets that
            # file truncated and overwritten with the holder's JSON.
            descriptor = _open_regular(self.path, os.O_RDWR, "lock file", one_name=True)
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
        self._descriptor = descriptor
        try:  # on a full disk: let go of the lock (and its sidecar), say so in one line
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
        except OSError as error:
            self.release()
            raise write_error(error, self.path) from None
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


def _open_regular(path: Path, flags: int, what: str = "", one_name: bool = False) -> int:
    """Open (creating, 0644 under umask 022) the regular file `path` without following a link and without
    blocking on a FIFO, and refuse anything else (with `one_name`, also a file with other hard links)."""
    check_replaceable(path, what)  # devices and FIFOs are refused before they are opened
    named = f"{what} {path}" if what else str(path)
    flags |= os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:  # a link planted between the check and the open
            raise UnsafePath(f"{named} is a symbolic link; latentcode never follows one; remove it or choose "
                             "another path") from None
        raise write_error(error, path) from None
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or (one_name and info.st_nlink > 1):
        os.close(descriptor)
        kind = kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else f"a file with {info.st_nlink} hard links"
        raise UnsafePath(f"{named} is {kind}; expected a regular file of its own; remove it or choose another path")
    os.set_blocking(descriptor, True)
    return descriptor


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
def new_temporary_file(target: str | Path) -> Path:
    """Create an empty `.NAME.<random>.tmp` beside `target`, with the mode a new file gets under the
    process umask (tempfile.mkstemp would make it 0600, and the rename would keep that)."""
    target = Path(target)
    for _ in range(100):
        candidate = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                                 | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except FileExistsError:
            continue
        except OSError as error:
            raise write_error(error, target) from None
        os.close(descriptor)
        return candidate
    raise FileExistsError(f"could not create a temporary file beside {target}")


def remove_dead_temporaries(target: str | Path) -> None:
    """Remove temporary files of `target` left by killed writers; call only while holding its lock."""
    target = Path(target)
    if not target.parent.is_dir():
        return
    # The random part holds no dot, so another target's temporaries (".NAME.x.<random>.tmp") never match.
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.[^./]+\.tmp$")
    for path in target.parent.iterdir():
        if pattern.match(path.name) and (path.is_symlink() or path.is_file()):
            path.unlink(missing_ok=True)  # unlink removes a link itself, never what it points to


# -- writing outputs ---------------------------------------------------------------------------------
class AtomicOutputs:
    """The files of one command, written as a set: each into a random temporary beside it, all
    renamed over their targets only when every one is written; on any error none is renamed and
    the temporaries are removed. A target that exists and is not a regular file is refused.

    >>> with AtomicOutputs(lock="results/rule") as outputs:
    ...     outputs.write_table("results/rule", table)     # rule.csv, rule.json
    ...     outputs.write_figure("results/rule", figure)   # rule.png
    >>> outputs.written   # [Path("results/rule.csv"), Path("results/rule.json"), Path("results/rule.png")]

    lock: a path whose sidecar lock (`.NAME.lock`) is held from entry to the last rename, so two
    commands writing the same outputs do not mix their files (the second is refused, or waits
    `wait` seconds). An existing target keeps its mode; a new one gets the umask's.

    Nested sets of one lock join: entered (in the same thread) inside a set that holds the same
    lock, a set adds its files to the enclosing one, and they are renamed with the enclosing set's
    (its `written` names them at once). So one command's outputs from several writers (`latentcode
    probe`'s table, then its plot) are all or none.
    """

    def __init__(self, lock: str | Path | None = None, *, wait: float | None = 0.0, purpose: str = "writing results",
                 hint: str = "wait until it has finished or choose another output"):
        self._lock = ExclusiveLock(lock, wait=wait, purpose=purpose, hint=hint) if lock is not None else None
        self._lock_key = None if lock is None else os.path.abspath(lock)
        self._temporaries: dict[Path, Path] = {}
        self._enclosing: AtomicOutputs | None = None  # the set of the same lock this one joined
        self._token: contextvars.Token | None = None
        self.written: list[Path] = []

    def __enter__(self) -> AtomicOutputs:
        if self._lock_key is not None:
            # The lock is not reentrant: a set of a lock this thread holds joins the set holding it.
            self._enclosing = next((outputs for outputs in _OPEN_SETS.get()
                                    if outputs._lock_key == self._lock_key), None)
            if self._enclosing is not None:
                return self
        if self._lock is not None:
            try:
                self._lock.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise write_error(error, self._lock.target) from None
            self._lock.acquire()
        self._token = _OPEN_SETS.set((*_OPEN_SETS.get(), self))
        return self

    def temporary(self, target: str | Path) -> Path:
        """The temporary file to write `target`'s content to (created empty, beside it)."""
        target = Path(target)
        if self._enclosing is not None:
            if target not in self.written:
                self.written.append(target)
            return self._enclosing.temporary(target)
        if target in self._temporaries:
            return self._temporaries[target]
        check_replaceable(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise write_error(error, target) from None
        if self._lock is not None:
            remove_dead_temporaries(target)
        self._temporaries[target] = new_temporary_file(target)
        return self._temporaries[target]

    def write_text(self, target: str | Path, text: str) -> None:
        self.write_bytes(target, text.encode())

    def write_bytes(self, target: str | Path, data: bytes) -> None:
        temporary = self.temporary(target)
        try:
            with open(temporary, "wb") as file:
                file.write(data)
        except OSError as error:
            raise write_error(error, target) from None

    def write_table(self, path_stem: str | Path, table) -> None:
        """A pandas `table` as `<stem>.csv` and `<stem>.json` (a list of records): every table's writer."""
        stem = Path(path_stem)
        table.to_csv(self.temporary(stem.with_name(f"{stem.name}.csv")), index=False)
        table.to_json(self.temporary(stem.with_name(f"{stem.name}.json")), orient="records", indent=1)

    def write_figure(self, path_stem: str | Path, figure, formats: Iterable[str] = ("png",), dpi=None) -> None:
        """A matplotlib `figure` as `<stem>.<format>` for each of `formats`: every figure's writer."""
        stem = Path(path_stem)
        for fmt in formats:
            figure.savefig(self.temporary(stem.with_name(f"{stem.name}.{fmt}")), format=fmt, dpi=dpi)

    def commit(self) -> list[Path]:
        """Rename every temporary over its target (after checking them all); returns the targets.
        A joined set renames nothing: the enclosing set renames its files."""
        if self._enclosing is not None:
            return self.written
        try:
            for target in self._temporaries:
                check_replaceable(target)
            for target, temporary in list(self._temporaries.items()):
                try:
                    os.chmod(temporary, stat.S_IMODE(os.stat(target, follow_symlinks=False).st_mode))
                except FileNotFoundError:
                    pass
                os.replace(temporary, target)
                del self._temporaries[target]
                self.written.append(target)
        except OSError as error:
            self.discard()
            raise write_error(error, target) from None
        except BaseException:
            self.discard()
            raise
        self._release()
        return self.written

    def discard(self) -> None:
        """Remove the temporaries not yet renamed and let go of the lock (a joined set: its own files
        leave the enclosing set)."""
        owner = self if self._enclosing is None else self._enclosing
        for target in list(self._temporaries) if self._enclosing is None else self.written:
            temporary = owner._temporaries.pop(target, None)
            if temporary is not None:
                with contextlib.suppress(OSError):
                    temporary.unlink(missing_ok=True)
        if self._enclosing is None:
            self._release()
        else:
            self.written = []

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._token is not None:
            _OPEN_SETS.reset(self._token)
            self._token = None
        if exc_type is None:
            self.commit()
            return
        targets = list(self._temporaries) or list(self.written)
        self.discard()
        if isinstance(exc, OSError) and not isinstance(exc, LatentcodeError):
            raise write_error(exc, targets[-1] if targets else "the output") from None


#: the sets this thread (context) has entered and not yet left, outermost first
_OPEN_SETS: contextvars.ContextVar[tuple[AtomicOutputs, ...]] = contextvars.ContextVar("atomic_outputs", default=())


def atomic_write_text(target: str | Path, text: str, *, lock: bool = False) -> Path:
    """Write `text` to `target` through a temporary and a rename; `lock`: hold the target's lock meanwhile."""
    target = Path(target)
    with AtomicOutputs(lock=target if lock else None) as outputs:
        outputs.write_text(target, text)
    return target


def open_for_append(path: str | Path, mode: str = "a"):
    """`open(path, "a")` (or "w") refusing links and non-regular files: for files written as they go (logs, metrics)."""
    descriptor = _open_regular(Path(path), os.O_WRONLY | {"a": os.O_APPEND, "w": os.O_TRUNC}[mode])
    return os.fdopen(descriptor, mode)


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
