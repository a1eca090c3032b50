"""MKL's fast matrix products on AMD CPUs: its Intel-only CPU check answered by the CPU's features.

torch's CPU build does its float32 matrix products in Intel's MKL, linked into `libtorch_cpu.so`,
which picks its code path by asking `mkl_serv_intel_cpu_true()` whether the CPU is Intel's; on an AMD
CPU it takes a slower path than the CPU's instructions allow (benchmarks/bench_mkl_on_amd.py).

Off unless asked: this rewrites a table of libtorch's memory for the whole process and changes its
results by float rounding. `latentcode train --mkl-on-amd` or `LATENTCODE_MKL_ON_AMD=1`
(`latentcode.switches`) asks for it; the run's record says which (`mkl_setting()`). A Python user
may call `use_mkl_fast_paths()` themselves.

`use_mkl_fast_paths()` points the slot of `libtorch_cpu.so`'s global offset table through which it
calls the check at a function that answers yes (what `LD_PRELOAD` of such a function does, for the
running process only), so that MKL chooses its path by the instruction sets the CPU reports. The
products then agree with the old path to float32 rounding, not bit for bit. Once per process, and
only where all of these hold (otherwise nothing changes and the returned line says why):

- Linux on x86-64, torch built with MKL, `libtorch_cpu.so` loaded and calling the check through its
  offset table;
- the CPU's vendor is AuthenticAMD and it has AVX2 and FMA;
- a C compiler builds the one-line answering function (`cc`, into the trusted kernel cache of
  `latentcode.models.kernel_cache`, loaded with ctypes: `AnswerLibrary`).

MKL keeps the path it chose at its first product for the rest of the process: `latentcode train
--mkl-on-amd` answers before it builds the model. Evaluation and extraction keep MKL's own choice.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import platform
import shutil
import struct
import subprocess
from pathlib import Path

import torch

from latentcode.files import ExclusiveLock, LockHeld, new_temporary_file
from latentcode.models.kernel_cache import (
    DIGEST_SUFFIX,
    UntrustedKernel,
    cpu_description,
    kernel_directory,
    loadable_path,
    open_trusted_directory,
    open_verified,
    record_digest,
    warn_once,
)
from latentcode.switches import switch

CHECK_SYMBOL = b"mkl_serv_intel_cpu_true"
TORCH_LIBRARY = "libtorch_cpu.so"
SWITCH_VARIABLE = "LATENTCODE_MKL_ON_AMD"
OLD_SWITCH_VARIABLE = "LATENTCODE_MKL_CPU_CHECK"  # `keep` only: the default now
REQUIRED_CPU_FLAGS = ("avx2", "fma")

SOURCE = "int latentcode_cpu_is_intel(void) { return 1; }\n"
FLAGS = ("-O2", "-shared", "-fPIC")


class AnswerLibrary:
    """`SOURCE` compiled once per machine and CPU into the trusted kernel cache (`latentcode.models.kernel_cache`),
    loaded with ctypes: `load()` -> the `ctypes.CDLL`, or None where it cannot be built or is refused
    (`failure()` says why)."""

    def __init__(self):
        self._library: ctypes.CDLL | None = None
        self._failure: str | None = None

    def failure(self) -> str | None:
        self.load()
        return self._failure

    def file_name(self) -> str:
        digest = hashlib.sha256(f"{SOURCE} {' '.join(FLAGS)} {cpu_description()}".encode()).hexdigest()[:16]
        return f"mkl_on_amd-{digest}.so"

    def load(self) -> ctypes.CDLL | None:
        if self._library is None and self._failure is None:
            try:
                self._library = self._build()
            except UntrustedKernel as error:
                self._failure = str(error)
                warn_once(self._failure)
            except OSError as error:
                self._failure = str(error)
        return self._library

    def _build(self) -> ctypes.CDLL:
        directory, name = kernel_directory(), self.file_name()
        directory_fd = open_trusted_directory(directory)
        try:
            descriptor = open_verified(directory_fd, name, directory)
            if descriptor is None:
                try:
                    with ExclusiveLock(directory / name, wait=300, purpose="building a kernel"):
                        descriptor = open_verified(directory_fd, name, directory)  # built meanwhile by another
                        if descriptor is None:
                            self._compile(directory / name)
                            descriptor = open_verified(directory_fd, name, directory)
                except LockHeld as error:
                    raise OSError(str(error)) from None
            if descriptor is None:
                raise OSError(f"{directory / name} vanished after it was built")
        finally:
            os.close(directory_fd)
        return ctypes.CDLL(loadable_path(descriptor, directory / name))  # the descriptor stays open

    def _compile(self, library_path: Path) -> None:
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise OSError("no C compiler (cc or gcc) on PATH")
        source_path = new_temporary_file(library_path.with_suffix(".c"))
        temporary = new_temporary_file(library_path)
        try:
            source_path.write_text(SOURCE)
            subprocess.run([compiler, *FLAGS, "-x", "c", str(source_path), "-o", str(temporary)],
                           check=True, capture_output=True, text=True)
            record_digest(temporary, library_path.with_name(library_path.name + DIGEST_SUFFIX))
            os.replace(temporary, library_path)
        except FileNotFoundError:
            raise OSError(f"the C compiler {compiler!r} does not exist") from None
        except subprocess.CalledProcessError as error:
            raise OSError(f"{compiler} failed: {error.stderr.strip()[-300:]}") from None
        finally:
            source_path.unlink(missing_ok=True)
            temporary.unlink(missing_ok=True)


ANSWER = AnswerLibrary()

_ELF_X86_64, _SHT_RELA, _SHT_DYNSYM = 62, 4, 11
_R_X86_64_GLOB_DAT, _R_X86_64_JUMP_SLOT = 6, 7
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4

_outcome: str | None = None
_replaced: dict[int, int] = {}  # slot address -> the pointer it held before


def requested() -> bool:
    """Whether the environment asks for the answer (`LATENTCODE_MKL_ON_AMD=1`); a value either switch
    does not take is refused in one line (`latentcode.switches.SwitchError`)."""
    switch(OLD_SWITCH_VARIABLE)
    return switch(SWITCH_VARIABLE) == "1"


def mkl_setting() -> str:
    """What this process does with MKL's CPU check, for a run's record: MKL's own answer unless
    `use_mkl_fast_paths()` was called, else the line it returned."""
    return _outcome if _outcome is not None else "MKL's own CPU check (the answer on AMD CPUs not asked for)"


def use_mkl_fast_paths() -> str:
    """Answer MKL's CPU check as above, once per process; a line that says what was done or why not.
    Called only where the user asked (module docstring)."""
    global _outcome
    if _outcome is None:
        try:
            _outcome = _answer_check()
        except (OSError, ValueError, struct.error, StopIteration) as error:
            _outcome = f"MKL's CPU check left as it is: {error}"
    return _outcome


def mkl_fast_paths_in_use() -> bool:
    """Whether this process answers MKL's CPU check (see `use_mkl_fast_paths`)."""
    return _outcome is not None and _outcome.startswith("MKL's CPU check answered")


def restore_mkl_cpu_check() -> None:
    """Give the check back to MKL (the slots their old pointers); a later `use_mkl_fast_paths()` answers
    it again. For before / after measurements in one process and for tests."""
    global _outcome
    for address, value in _replaced.items():
        _write_pointer(address, value)
    _replaced.clear()
    _outcome = None


def _answer_check() -> str:
    reason = _why_not_on_this_machine()
    if reason:
        return f"MKL's CPU check left as it is: {reason}"
    library_path, base = _loaded(TORCH_LIBRARY)
    slots = _offset_table_slots(library_path, CHECK_SYMBOL)
    if not slots:
        return (f"MKL's CPU check left as it is: {library_path} does not call {CHECK_SYMBOL.decode()} through its "
                "offset table")
    answer = answer_address()
    if answer is None:
        return f"MKL's CPU check left as it is: {ANSWER.failure()}"
    for slot in slots:
        _replaced.setdefault(base + slot, ctypes.c_void_p.from_address(base + slot).value)
        _write_pointer(base + slot, answer)
    return f"MKL's CPU check answered yes for this AMD CPU ({len(slots)} slot of {Path(library_path).name})"


def _why_not_on_this_machine() -> str | None:
    """Why this machine and torch build cannot have the check answered, or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"not Linux on x86-64 ({platform.system()} {platform.machine()})"
    if not torch.backends.mkl.is_available():
        return "torch is built without MKL"
    vendor, flags = _cpu()
    if vendor != "AuthenticAMD":
        return f"the CPU's vendor is {vendor or 'unknown'}, not AuthenticAMD"
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in flags]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    return None


def _cpu() -> tuple[str, set[str]]:
    """The CPU's vendor and instruction-set flags from /proc/cpuinfo."""
    vendor, flags = "", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return vendor, flags


def _loaded(name: str) -> tuple[str, int]:
    """The path of the loaded library whose file is `name`, and its load address (that of its first
    mapping, at file offset 0: a shared library's addresses are relative to it)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)  # the path, the sixth field, may hold spaces
        if len(fields) == 6 and Path(fields[5]).name == name and int(fields[2], 16) == 0:
            return fields[5], int(fields[0].split("-")[0], 16)
    raise ValueError(f"{name} is not loaded in this process")


def _offset_table_slots(library_path: str, symbol: bytes) -> list[int]:
    """Offsets (from the load address) of the offset-table slots through which the ELF64 x86-64 library
    calls `symbol` (its GLOB_DAT and JUMP_SLOT relocations), read from its section headers."""
    with open(library_path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1 or struct.unpack_from("<H", elf, 0x12)[0] != _ELF_X86_64:
            raise ValueError(f"{library_path} is not a little-endian ELF64 x86-64 file")
        (section_offset,) = struct.unpack_from("<Q", elf, 0x28)
        entry_size, count = struct.unpack_from("<HH", elf, 0x3A)
        # (name, type, flags, address, offset, size, link, info, alignment, entry size) per section
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, section_offset + i * entry_size) for i in range(count)]
        symbols_index = next(i for i, section in enumerate(sections) if section[1] == _SHT_DYNSYM)
        symbols, names = sections[symbols_index], sections[sections[symbols_index][6]]
        wanted = None
        for index in range(symbols[5] // 24):
            (name_offset,) = struct.unpack_from("<I", elf, symbols[4] + index * 24)
            start = names[4] + name_offset
            if elf[start:start + len(symbol) + 1] == symbol + b"\0":
                wanted = index
                break
        if wanted is None:
            return []
        slots = []
        for section in sections:
            if section[1] == _SHT_RELA and section[6] == symbols_index:
                for index in range(section[5] // 24):
                    offset, info = struct.unpack_from("<QQ", elf, section[4] + index * 24)
                    if info >> 32 == wanted and info & 0xFFFFFFFF in (_R_X86_64_GLOB_DAT, _R_X86_64_JUMP_SLOT):
                        slots.append(offset)
        return slots


def _write_pointer(address: int, value: int) -> None:
    """Store the pointer `value` at `address`, making its page writable for the store and giving it its
    protection back afterwards (read-only where the loader made the table so)."""
    protection = _protection(address)
    page = address & ~(mmap.PAGESIZE - 1)
    mprotect = ctypes.CDLL(None, use_errno=True).mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if mprotect(page, mmap.PAGESIZE, protection | _PROT_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect refused to make the offset table writable")
    ctypes.c_void_p.from_address(address).value = value
    if not protection & _PROT_WRITE and mprotect(page, mmap.PAGESIZE, protection) != 0:
        raise OSError(ctypes.get_errno(), "mprotect refused to restore the offset table's protection")


def _protection(address: int) -> int:
    """The protection of the mapping holding `address`, from /proc/self/maps."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, permissions = line.split()[:2]
        start, end = (int(bound, 16) for bound in span.split("-"))
        if start <= address < end:
            return ((_PROT_READ if permissions[0] == "r" else 0) | (_PROT_WRITE if permissions[1] == "w" else 0)
                    | (_PROT_EXEC if permissions[2] == "x" else 0))
    raise ValueError(f"address {address:#x} is not mapped")


def answered_slot_values() -> list[int]:
    """The pointers now held by the offset-table slots of the check (for tests)."""
    library_path, base = _loaded(TORCH_LIBRARY)
    return [ctypes.c_void_p.from_address(base + slot).value for slot in _offset_table_slots(library_path, CHECK_SYMBOL)]


def answer_address() -> int | None:
    """The address of the answering function, or None where it cannot be built."""
    library = ANSWER.load()
    return None if library is None else ctypes.cast(library.latentcode_cpu_is_intel, ctypes.c_void_p).value
