"""examples/intervene_on_sdpa_model.py runs and says what it promises."""

import re
import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "intervene_on_sdpa_model.py"


def test_the_sdpa_example_runs_and_its_checks_hold(capsys):
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "identity edit, outputs bit-identical: True" in out
    assert "recorded (edited) code equals the other input's: True" in out
    difference = float(re.search(r"vs by hand: max \|difference\| (\S+)", out).group(1))
    assert difference < 1e-6
