"""Issue 34: what a report copies and embeds goes through the safe-output module (no link followed,
only PNGs of a figure's size), and a `latentcode patch` output is checked at open: damaged ones and
ones of another task or model are refused in one line, before any work."""

from __future__ import annotations

import base64
import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from latentcode.analysis.patch_outputs import PatchOutputError, read_patch_output
from latentcode.cli import main
from latentcode.files import UnsafePath
from latentcode.safe_reads import UnreadableInput, png_size, read_png, read_regular_file

from .synthetic import write_codes

TABLE = ("group,n,follow (different),follow (third),transfer,transfer se\n"
         "0:31:*,16,0.5,0.25,0.25,0.1\n1:*:*,16,0.75,0.25,0.5,0.1\n")


def png(width: int = 4, height: int = 3) -> bytes:
    """A valid grey PNG of width x height pixels, built from the format's definition (not by matplotlib)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def codes(tmp_path_factory) -> Path:
    return write_codes(tmp_path_factory.mktemp("codes") / "fuzzy.h5", task="fuzzy_logic",
                       n_per_split={"train": 120, "ood": 60})


def patch_output(directory: Path, task: dict, *, table: str = TABLE, summary: dict | None = None,
                 image: bytes | None = None, name: str = "patch") -> Path:
    stem = directory / name
    stem.with_name(name + ".csv").write_text(table)
    summary = {"run": "models/fuzzy_logic-hyla", "task": task, "split": "ood", "variant": "fixed_query", "n": 16,
               "groups": 2} if summary is None else summary
    stem.with_name(name + ".json").write_text(json.dumps(summary))
    stem.with_name(name + ".png").write_bytes(png() if image is None else image)
    return stem


def test_png_size_reads_the_header_of_a_png_built_by_hand():
    assert png_size(png(7, 5)) == (7, 5)
    assert png_size(b"GIF89a" + bytes(30)) is None


def test_a_link_a_fifo_and_a_large_file_are_refused_without_reading_them(tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_bytes(png())  # even a readable PNG behind a link is not followed
    (tmp_path / "link.png").symlink_to(secret)
    with pytest.raises(UnsafePath, match="is a symbolic link -> .*id_rsa; latentcode reads only regular files"):
        read_png(tmp_path / "link.png")
    os.mkfifo(tmp_path / "fifo.png")
    with pytest.raises(UnsafePath, match="is a FIFO; expected a regular file"):
        read_png(tmp_path / "fifo.png")  # would block for ever if it were opened for reading normally
    (tmp_path / "big").write_bytes(bytes(2000))
    with pytest.raises(UnreadableInput, match="has 2000 bytes; expected at most 1000"):
        read_regular_file(tmp_path / "big", "table", 1000)
    (tmp_path / "key.png").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(UnreadableInput, match=r"is not a PNG image \(it starts with b'-----BEG"):
        read_png(tmp_path / "key.png")
    (tmp_path / "huge.png").write_bytes(png(100000, 2)[:40])
    with pytest.raises(UnreadableInput, match="is a PNG of 100000 x 2 pixels; expected 1 to 32768 a side"):
        read_png(tmp_path / "huge.png")
    assert read_png(tmp_path / "huge.png", max_pixels=200000).startswith(b"\x89PNG")


def test_the_report_embeds_and_copies_the_patch_map(codes, tmp_path):
    import h5py

    with h5py.File(codes) as file:
        task = json.loads(file.attrs["task_config"])
    stem = patch_output(tmp_path, task, image=png(9, 4))
    page = tmp_path / "report.html"
    assert main(["report", "--label", "rule", "--codes", str(codes), "--patch", str(stem), "--out", str(page), "--quiet"]) == 0
    copy = tmp_path / "report_files" / "patch_patch.png"
    assert copy.read_bytes() == png(9, 4) and not copy.is_symlink()
    assert base64.b64encode(png(9, 4)).decode() in page.read_text()
    assert "0.500" in page.read_text()  # the best group's transfer


def test_a_second_users_links_are_never_followed(codes, tmp_path, capsys):
    """A planted link at the map makes the report refuse (it used to embed a private key, base64, into a
    world-readable page); a planted link at the copy's place is refused, not written through (it used
    to get another file overwritten with the PNG)."""
    import h5py

    with h5py.File(codes) as file:
        task = json.loads(file.attrs["task_config"])
    victim = tmp_path / "victim"
    victim.write_text("another user's private key\n")
    stem = patch_output(tmp_path, task)
    stem.with_name("patch.png").unlink()
    stem.with_name("patch.png").symlink_to(victim)
    page = tmp_path / "report.html"
    assert main(["report", "--label", "rule", "--codes", str(codes), "--patch", str(stem), "--out", str(page), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"--patch {stem}.png is a symbolic link -> {victim}" in error
    assert not page.exists() and not (tmp_path / "report_files").exists()

    other = patch_output(tmp_path, task, name="other")
    files_dir = tmp_path / "mine_files"
    files_dir.mkdir()
    (files_dir / "patch_other.png").symlink_to(victim)  # planted by a second user where the copy goes
    assert main(["report", "--label", "rule", "--codes", str(codes), "--patch", str(other), "--out", str(tmp_path / "mine.html"),
                 "--overwrite", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{files_dir / 'patch_other.png'} is a symbolic link" in error
    assert victim.read_text() == "another user's private key\n"
    assert (files_dir / "patch_other.png").is_symlink() and not (tmp_path / "mine.html").exists()


DAMAGED = [
    ("not-json", {"summary_text": "{not json"}, "patch.json is not a JSON file (Expecting property name"),
    ("a-list", {"summary_text": "[1, 2]"}, "patch.json holds a JSON list; expected an object"),
    ("task-text", {"summary": {"task": "fuzzy_logic"}}, "patch.json: 'task' is \"fuzzy_logic\"; expected an object"),
    ("no-task", {"summary": {"run": "r"}}, "patch.json lacks 'task'"),
    ("n-text", {"summary": {"task": {}, "n": "many"}}, "patch.json: 'n' is \"many\"; expected an integer"),
    ("attribution-text", {"summary": {"task": {}, "attribution_vs_exact": {"pearson": "high"}}},
     "attribution_vs_exact.pearson is \"high\"; expected a number"),
    ("no-transfer-column", {"table": "group,n\n0:*:*,3\n"}, "patch.csv lacks the column(s) ['transfer']"),
    ("empty-csv", {"table": ""}, "patch.csv is empty; expected a header and one row per site group"),
    ("header-only", {"table": "group,transfer\n"}, "patch.csv holds a header and no rows"),
    ("text-for-numbers", {"table": "group,transfer\n0:*:*,lots\n"},
     "patch.csv line 2: column 'transfer' holds 'lots'; expected a number"),
    ("ragged-row", {"table": "group,transfer\n0:*:*,0.1,9\n"}, "patch.csv line 2 has 3 fields; the header has 2"),
    ("binary-csv", {"table_bytes": b"\xff\xfe\x00garbage"}, "patch.csv is not a text (CSV) file"),
    ("map-not-png", {"image": b"GIF89a" + bytes(40)}, "patch.png is not a PNG image"),
]


@pytest.mark.parametrize("damage, message", [row[1:] for row in DAMAGED], ids=[row[0] for row in DAMAGED])
def test_a_damaged_patch_output_is_one_line(codes, tmp_path, capsys, damage, message):
    stem = patch_output(tmp_path, {"name": "fuzzy_logic", "n_variables": 3}, table=damage.get("table", TABLE),
                        summary=damage.get("summary"), image=damage.get("image"))
    if "summary_text" in damage:
        stem.with_name("patch.json").write_text(damage["summary_text"])
    if "table_bytes" in damage:
        stem.with_name("patch.csv").write_bytes(damage["table_bytes"])
    with pytest.raises((PatchOutputError, UnreadableInput)):
        read_patch_output(stem)
    before = sorted(path.name for path in tmp_path.iterdir())
    status = main(["report", "--label", "rule", "--codes", str(codes), "--patch", str(stem), "--out", str(tmp_path / "r.html"), "--quiet"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1 and "Traceback" not in error, error
    assert message in error
    assert sorted(path.name for path in tmp_path.iterdir()) == before


def test_a_patch_output_of_another_task_or_model_is_refused(codes, tmp_path, capsys):
    """An SRAVEN patching map beside fuzzy-logic codes used to be shown as if it belonged to them."""
    sraven = patch_output(tmp_path, {"name": "sraven", "n_features": 4}, name="sraven")
    assert main(["report", "--label", "rule", "--codes", str(codes), "--patch", str(sraven), "--out", str(tmp_path / "r.html")]) == 2
    error = capsys.readouterr().err
    assert f"--patch {sraven}.json (task 'sraven') comes from another task than codes file {codes} " \
           "(task 'fuzzy_logic')" in error
    other_frac = patch_output(tmp_path, {"name": "fuzzy_logic", "n_variables": 4}, name="variables")
    assert main(["report", "--label", "rule", "--codes", str(codes), "--patch", str(other_frac), "--out", str(tmp_path / "r.html")]) == 2
    assert "n_variables=4 in the patching output, 3 in the run" in capsys.readouterr().err
    other_model = patch_output(tmp_path, {"name": "fuzzy_logic", "n_variables": 3}, name="model",
                               summary={"task": {"name": "fuzzy_logic", "n_variables": 3},
                                        "checkpoint_sha256": "cd" * 32})
    import shutil

    import h5py

    recorded = tmp_path / "recorded.h5"
    shutil.copy(codes, recorded)
    with h5py.File(recorded, "r+") as file:
        file.attrs["checkpoint_sha256"] = "ab" * 32
    assert main(["report", "--label", "rule", "--codes", str(recorded), "--patch", str(other_model), "--out", str(tmp_path / "r.html")]) == 2
    assert "checkpoint cdcdcdcdcdcd) patched another model than the report's codes and runs (checkpoints " \
           "['abababababab'])" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()
