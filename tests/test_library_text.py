"""Library docstrings and comments say what the code does and why, not which issue or machine it was
tuned on: measurements live in benchmarks/results/, findings on the results pages."""

import re
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "latentcode"
HISTORY = re.compile(r"issue [0-9]+|EPYC|2-core")


def test_no_module_names_an_issue_or_our_machines():
    found = [f"{path.relative_to(LIBRARY.parent)}:{number}: {line.strip()}"
             for path in sorted(LIBRARY.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not found, "\n".join(found)
