"""Issue 36: why permuted SRAVEN HYLA seed 2 learned far less than seeds 0 and 1, from the recorded
curves, and a rerun of seed 2 with the corrected `lecun_normal_` (variance 1/fan_in, was 0.77/fan_in).

The rerun's evaluations are kept in results/hyla_seed/ (its metrics.jsonl as the trainer wrote it; the
run was stopped once its curve answered the question, so it has no summary and is not a recorded run)."""

from __future__ import annotations

import json

from . import RESULTS
from .recorded import eval_records

HYLA_SEED = RESULTS / "hyla_seed"
RERUNS = {"sraven-M2-hyla-s2-fixed-init": "seed 2, corrected init"}


def _evals_of_file(path) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [record for record in records if record.get("event") == "eval"]


def curves() -> dict[str, list[dict]]:
    """`{label: eval records}`: the recorded seeds 0-2 (old init) and the reruns found."""
    found = {f"seed {seed}, old init": eval_records(f"sraven-M2-hyla-s{seed}") for seed in (0, 1, 2)}
    for name, label in RERUNS.items():
        path = HYLA_SEED / f"{name}.metrics.jsonl"
        if path.is_file():
            found[label] = _evals_of_file(path)
    return found


def hyla_seed_table() -> str:
    """Train and OOD accuracy (all features right, %) at each evaluation, one column per run."""
    found = curves()
    steps = sorted({record["step"] for records in found.values() for record in records})
    lines = ["| step | " + " | ".join(f"{label}: train / ood" for label in found) + " |",
             "|---" * (len(found) + 1) + "|"]
    for step in steps:
        cells = []
        for records in found.values():
            at = [record for record in records if record["step"] == step]
            cells.append(f"{100 * at[0]['splits']['train']['accuracy']:.1f} / {100 * at[0]['splits']['ood']['accuracy']:.1f}"
                         if at else "")
        lines.append(f"| {step:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _accuracy_at(records: list[dict], step: int, split: str) -> float | None:
    at = [record for record in records if record["step"] == step]
    return 100 * at[0]["splits"][split]["accuracy"] if at else None


def hyla_seed_verdict() -> str:
    """One clause for the SRAVEN verdict: the seed-2 rerun against the recorded seed-2 run at the rerun's
    last evaluation ("" where there is no rerun)."""
    found = curves()
    rerun = found.get(RERUNS["sraven-M2-hyla-s2-fixed-init"])
    if not rerun:
        return ""
    step = rerun[-1]["step"]
    old = found["seed 2, old init"]
    return (f"HYLA seed 2 stalled on a plateau (train accuracy {_accuracy_at(old, 8000, 'train'):.1f}% after "
            f"8,000 steps); rerun with the corrected init it reached {_accuracy_at(rerun, step, 'train'):.1f}% train, "
            f"{_accuracy_at(rerun, step, 'ood'):.1f}% OOD at step {step:,} (old init at that step: "
            f"{_accuracy_at(old, step, 'train'):.1f}% train, {_accuracy_at(old, step, 'ood'):.1f}% OOD; one rerun, "
            "see 'HYLA's seed 2')")
