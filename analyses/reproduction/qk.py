"""Issue 48's findings on the results page: the section `analyses/qk_findings.py` recorded in
results/qk_findings/ (`qk_findings.md`, its tables and figures), with its links made relative to the page."""

from __future__ import annotations

from pathlib import Path

QK_FINDINGS = Path(__file__).resolve().parents[1] / "results" / "qk_findings"


def qk_section() -> str:
    """The recorded findings, or how to make them."""
    recorded = QK_FINDINGS / "qk_findings.md"
    if not recorded.is_file():
        return "Not measured yet: `nice -n 15 python analyses/qk_findings.py`, then `python analyses/reproduce.py page`."
    body = recorded.read_text()
    for picture in sorted(QK_FINDINGS.glob("*.png")):
        body = body.replace(f"]({picture.name})", f"](results/qk_findings/{picture.name})")
    return body.strip()
