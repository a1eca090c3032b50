"""Why do codes take their value? Exact query-key attribution (issue 48), checked by path patching, on
the two models of the results page: SmolLM2-135M's induction heads and layer 2 of sraven-hyla.

SmolLM2 (`analyses/qk_analysis/smollm2.py`): on --n sequences of bos + --half random tokens repeated once, for
the induction heads of the SmolLM2 page (--heads, default 18.6 18.7 17.3) and a head drawn at random
from their layers: the key-side components that carry the score at induction pairs and at as many
non-induction pairs, the previous-token score of each (mean attention from t to t - 1), and the key
side of each head path-patched at its induction pairs: the top key-side component removed, beside a
random direction and a random other head, each rescaled to the removed component's norm at every
position; the change of the induction code and of the loss on the repeated tokens.

sraven-hyla (`analyses/qk_analysis/sraven.py`): layer 2 at the group of code pairs `latentcode patch
models/sraven-hyla --search` found (queries 7, 11, 19, 23 x keys 3, 7, 11, 15, 19: the queried
feature's context cells), on --sraven-n OOD instances: which head's code is most rule-selective, and
which query-side and key-side components carry the rule-selective part of its score (the between-rule
variance of the score, split exactly over the components); the top component of each side
path-patched out beside a random direction of equal norm: the rule-selective variance left in the code,
the loss and the accuracy on the queried feature.

Writes, under --out (default analyses/results/qk_findings): `qk_findings.md` (the section the results
page shows: `python analyses/reproduce.py page`), `smollm2_*.csv`, `sraven_*.csv`, `summary.json` and the
figures `smollm2_qk_terms.png`, `smollm2_patch_effects.png`, `sraven_qk_share.png`, `sraven_qk_terms.png`,
`sraven_patch_effects.png`.

    nice -n 15 python analyses/qk_findings.py                     # both halves: about 25 min on one busy core
    nice -n 15 python analyses/qk_findings.py --only sraven       # one half (the other's recorded outputs kept)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "qk_findings"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20, help="SmolLM2 sequences (default 20)")
    parser.add_argument("--half", type=int, default=64, help="random tokens per copy (default 64: T = 129)")
    parser.add_argument("--heads", nargs="+", default=["18.6", "18.7", "17.3"], help="induction heads, LAYER.HEAD")
    parser.add_argument("--sraven-n", type=int, default=512, help="sraven-hyla OOD instances (default 512)")
    parser.add_argument("--only", choices=["smollm2", "sraven"], default=None, help="one half; the other's "
                        "recorded outputs are kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--redraw", action="store_true", help="only draw the figures again from the recorded "
                        "tables and summary.json under --out (no model is run)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser.parse_args()


def main() -> None:
    import torch

    from latentcode.files import AtomicOutputs

    torch.set_num_threads(1)
    args = arguments()
    out = Path(args.out)
    started = time.time()

    def say(text: str) -> None:
        if not args.quiet:
            print(f"{text} [{time.time() - started:.0f} s]", flush=True)

    summary_path = out / "summary.json"
    if args.redraw:
        redraw(out, json.loads(summary_path.read_text()), say)
        return
    texts, csvs, drawn, parts = {}, {}, {}, {}
    command = "nice -n 15 python analyses/qk_findings.py " + " ".join(sys.argv[1:])
    if args.only in (None, "smollm2"):
        from qk_analysis import smollm2 as qk_smollm2

        result = qk_smollm2.run(args, say)
        frames = qk_smollm2.tables(result)
        texts["smollm2"] = qk_smollm2.markdown(result, frames)
        csvs.update({f"smollm2_{name}": frame for name, frame in frames.items()})
        drawn.update(qk_smollm2.figures(result, frames))
        parts["smollm2"] = dict(n=result["n"], half=args.half, heads=result["heads"], control=result["control"],
                                seed=args.seed, seconds=round(result["seconds"], 1), command=command)
    if args.only in (None, "sraven"):
        from qk_analysis import sraven as qk_sraven

        result = qk_sraven.run(args, say)
        frames = qk_sraven.tables(result)
        texts["sraven"] = qk_sraven.markdown(result, frames)
        csvs.update({f"sraven_{name}": frame for name, frame in frames.items()})
        drawn.update(qk_sraven.figures(result, frames))
        parts["sraven"] = dict(n=result["n"], n_fresh=result["n_fresh"], layer=result["layer"], head=result["head"],
                               tops=result["tops"], rules_present=result["rules_present"],
                               p=[float(x) for x in result["p"]], seed=args.seed,
                               seconds=round(result["seconds"], 1), command=command)
    import matplotlib.pyplot as plt

    with AtomicOutputs(lock=out / "qk_findings", purpose="analyses/qk_findings.py") as outputs:
        # read under the lock, at the end: a run of the other half meanwhile (--only) is kept
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        summary.update(parts)
        for part in ("smollm2", "sraven"):
            if part not in texts and (out / f"{part}.md").is_file():
                texts[part] = (out / f"{part}.md").read_text()
        made_by = "; ".join(f"{part}: `{summary[part]['command']}` ({summary[part]['seconds'] / 60:.0f} min)"
                            for part in ("smollm2", "sraven") if "command" in summary.get(part, {}))
        page = ["Made by `analyses/qk_findings.py` (" + made_by + "; settings in `summary.json`). Terms are the "
                "head's score before sigma split exactly over the residual stream's components with the "
                "normalisation's scale frozen per position (`latentcode qk`); a path patch removes one component from "
                "one side of one head only.", ""]
        for part, heading, pictures in (("smollm2", "SmolLM2-135M: the induction heads", ("qk_terms", "patch_effects")),
                                        ("sraven", "sraven-hyla, layer 2: the rule",
                                         ("qk_share", "qk_terms", "patch_effects"))):
            page += [f"### {heading}", "", texts.get(part, "Not measured yet.").strip(), ""]
            page += [f"![{part} {picture}]({part}_{picture}.png)\n" for picture in pictures]
        for name, frame in csvs.items():
            outputs.write_text(out / f"{name}.csv", frame.to_csv(index=False, float_format="%.6g"))
        for part, text in texts.items():
            outputs.write_text(out / f"{part}.md", text)
        for name, figure in drawn.items():
            outputs.write_figure(out / name, figure, ("png",), dpi=110)
            plt.close(figure)
        outputs.write_text(out / "qk_findings.md", "\n".join(page))
        outputs.write_text(summary_path, json.dumps(summary, indent=1) + "\n")
    say(f"wrote {out}")


def redraw(out: Path, summary: dict, say) -> None:
    """The figures again from the recorded tables (`PART_NAME.csv`) and the settings in summary.json."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from qk_analysis import smollm2, sraven

    from latentcode.files import AtomicOutputs

    drawn = {}
    for part, module in (("smollm2", smollm2), ("sraven", sraven)):
        if part not in summary:
            continue
        frames = {file.stem[len(part) + 1:]: pd.read_csv(file, dtype={"head": str})
                  for file in sorted(out.glob(f"{part}_*.csv"))}
        drawn.update(module.figures(summary[part], frames))
    with AtomicOutputs(lock=out / "qk_findings", purpose="analyses/qk_findings.py --redraw") as outputs:
        for name, figure in drawn.items():
            outputs.write_figure(out / name, figure, ("png",), dpi=110)
            plt.close(figure)
    say(f"drew {', '.join(drawn)} again under {out}")


if __name__ == "__main__":
    main()
