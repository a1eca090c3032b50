"""Train a model, extract its latent codes, decode the sub-task: the toolkit's pipeline in Python.

    python examples/train_then_extract.py            # about a minute on 2 CPU cores (tiny scale)

Uses the same functions as the command line:
    latentcode train --preset sraven --attention hyla --scale tiny --out runs/example
    latentcode extract runs/example --split train --n 1024 --sites sraven-rule --out codes.h5
    latentcode extract runs/example --split ood --n 1024 --sites sraven-rule --out codes.h5 --append
    latentcode probe codes.h5 --label rule --fit-split train --test-split ood
A tiny run learns little: use --scale cpu (under an hour) or the shipped checkpoints in models/
for latent codes worth reading.
"""

import tempfile
from pathlib import Path

import latentcode
from latentcode.analysis import decode
from latentcode.store import CodeFile

with tempfile.TemporaryDirectory() as folder:
    folder = Path(folder)
    # 1. Train: the paper's SRAVEN recipe and model, scaled down to a few dozen steps.
    config = latentcode.build_train_config("sraven", scale="tiny", attention="hyla")
    run = latentcode.train(config, folder / "run", progress=False)
    print(f"trained {run}: ood accuracy {run.final_metrics['ood']['accuracy']:.3f}")

    # 2. Extract: the latent codes a[:, q, k] of the last query token attending to the same feature
    #    in the last row's context panels, on unpermuted instances, for fit and test splits.
    codes_path = folder / "codes.h5"
    for index, split in enumerate(("train", "ood")):
        latentcode.extract(run.path, sites="sraven-rule", split=split, n=1024, out=codes_path,
                           append=index > 0, progress=False)
    codes = CodeFile(codes_path)
    print(codes)
    print("codes of the first site, first example:", codes.codes(codes.sites[0], split="ood")[0].round(2))

    # 3. Decode the rule of the query position, fitted in distribution and scored OOD.
    table = decode(codes, "rule", fit_split="train", test_split="ood")
    print(table[table["metric"] == "accuracy"][["layer", "value", "validation", "selected", "strongest_baseline",
                                                "strongest_baseline_value"]].to_string(index=False))
