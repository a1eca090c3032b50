"""The results page's index of the paper (analyses/reproduction/paper_index.py) and the subcommands
that regenerate recorded results (`reproduce.py interventions`, `reproduce.py code-figures`)."""

import runpy
import sys
from pathlib import Path

import pytest

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
RESULTS = ANALYSES / "results"


@pytest.fixture
def reproduction(monkeypatch):
    """analyses/reproduction as an importable package (reproduce.py puts analyses/ on the path)."""
    import importlib

    monkeypatch.syspath_prepend(str(ANALYSES))
    return lambda name: importlib.import_module(f"reproduction.{name}")


def reproduce(monkeypatch, capsys, *args) -> str:
    monkeypatch.syspath_prepend(str(ANALYSES))
    monkeypatch.setattr(sys, "argv", ["reproduce.py", *args])
    try:
        runpy.run_path(str(ANALYSES / "reproduce.py"), run_name="__main__")
    except SystemExit as exit:  # --help
        assert exit.code == 0
    return capsys.readouterr().out


def test_every_item_of_the_paper_has_a_script_and_its_output_or_a_reason(reproduction):
    index = reproduction("paper_index")
    assert index.unaccounted() == []
    named = {item.item.split(",")[0].rstrip("ABCDEF") for item in index.PAPER}
    assert {f"Fig. {n}" for n in range(1, 7)} | {"Table A1", "Table A2"} <= named
    template = reproduction("page").PAGE_TEMPLATE
    for item in index.PAPER:
        if item.reproduced:
            assert f"\n## {item.section}" in template, item.item  # its section is on the page
            assert not item.missing
        else:
            assert item.reason and item.reason in index.paper_index(), item.item


def test_an_item_with_a_script_but_no_recorded_output_and_no_reason_is_caught(reproduction, tmp_path):
    index = reproduction("paper_index")
    script_only = index.PaperItem("Fig. 9", "made up", script="analyses/latent_tsne.py",
                                  outputs=("results/nowhere/fig9.png",), section="Fig. 3 and Fig. 4")
    no_script = index.PaperItem("Fig. 10", "made up", script="analyses/no_such_script.py",
                                outputs=("results/figures/fig2c_ood_r2_vs_held_out.png",))
    nothing = index.PaperItem("Table 9", "made up")
    assert index.unaccounted([script_only, no_script, nothing]) == [script_only, no_script, nothing]
    with_reason = index.PaperItem("Fig. 9", "made up", script="analyses/latent_tsne.py",
                                  outputs=("results/nowhere/fig9.png",), reason="too slow here")
    assert index.unaccounted([with_reason]) == []


def test_the_index_links_every_recorded_output(reproduction):
    index = reproduction("paper_index")
    table = index.paper_index()
    assert len(table.splitlines()) == 2 + len(index.PAPER)
    for item in index.PAPER:
        if item.reproduced:
            for output in item.outputs:
                assert f"]({output})" in table


def test_the_interventions_plan_lists_every_file_it_records(monkeypatch, capsys, reproduction):
    """What `interventions --plan` says it writes is exactly what results/interventions/ holds for each page."""
    plan = reproduce(monkeypatch, capsys, "interventions", "--plan", "--models", "models")
    written = {line.split("writes ", 1)[1] for line in plan.splitlines() if line.startswith("    writes ")}
    interventions = reproduction("interventions")
    for result in interventions.SCRIPTED:
        assert f"python analyses/{result.script} --runs-from models" in plan
        recorded = {f"analyses/results/{result.folder}/{path.name}" for path in result.recorded.iterdir()
                    if not path.name.startswith(".")}
        assert recorded == {path for path in written if path.startswith(f"analyses/results/{result.folder}/")}
    assert "analyses/results/interventions/localisation/README.md" in written
    assert "analyses/results/interventions/localisation/sraven-hyla/map.png" in written
    help_text = reproduce(monkeypatch, capsys, "interventions", "--help")
    for choice in interventions.CHOICES:
        assert choice in help_text
    assert "analyses/results/interventions/NAME/" in help_text


def test_only_plans_the_pages_chosen(monkeypatch, capsys):
    plan = reproduce(monkeypatch, capsys, "interventions", "--plan", "--only", "topographic_similarity")
    assert "topographic_similarity.py" in plan and "rule_swap" not in plan and "rule_localisation" not in plan


def test_the_code_figures_plan_writes_what_the_index_shows(monkeypatch, capsys, reproduction):
    plan = reproduce(monkeypatch, capsys, "code-figures", "--plan", "--models", "models")
    assert "python analyses/latent_tsne.py --runs-from models --task sraven" in plan
    assert "python analyses/sraven_rule_heatmap.py --runs-from models" in plan
    for item in reproduction("paper_index").PAPER:
        if item.item in ("Fig. 3", "Fig. 4"):
            for output in item.outputs:
                assert f"writes analyses/{output}" in plan


def test_a_recorded_figure_is_a_palette_png_of_the_same_picture(reproduction):
    import io

    import numpy as np
    from PIL import Image

    picture = np.zeros((20, 30, 4), dtype=np.uint8)
    picture[..., 3] = 255
    picture[5:15, 10:20, 0] = 200  # a red square on black
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    kept = Image.open(io.BytesIO(reproduction("scripted").palette_png(buffer.getvalue())))
    assert kept.mode == "P"
    assert np.array_equal(np.asarray(kept.convert("RGB")), picture[..., :3])
