"""What `python analyses/reproduce.py` runs, one module per part of the results page.

    plan.py       which runs the page needs (`plan`), trained through latentcode.training.sweeps'
                  scheduler (`train`) and recorded under analyses/results/runs/
    recorded.py   the recorded runs, read through latentcode.rundir.RunRecord
    fuzzy.py, sraven.py, language.py, decoding.py
                  the page's tables and figures, one section of the paper each, and the commands that
                  record what a section reads besides the runs (decoding, language codes, per-rule)
    verdicts.py   each of the paper's findings checked against the recorded numbers
    scripted.py   results an analysis script makes on the shipped models, recorded under results/:
                  interventions.py (the intervention pages), code_figures.py (Fig. 3 and 4)
    paper_index.py every figure and table of the paper, mapped to its script and output or a reason
    page.py       analyses/RESULTS.md, written from all of the above

Every file is written through latentcode.files (atomic, locked, never through a planted link).
The package is imported with analyses/ on the path, as `python analyses/reproduce.py` runs.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # analyses/
RESULTS = ROOT / "results"
RECORDED = RESULTS / "runs"
PAGE = ROOT / "RESULTS.md"
