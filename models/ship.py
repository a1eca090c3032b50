"""Turn a finished training run into a shipped checkpoint with a model card.

    python models/ship.py RUN_DIR NAME --command "latentcode train ..."

Copies the run's config.json, metrics.jsonl and summary.json into models/NAME/, stores the final
model with half-precision weights (models/NAME/model/, about half the size), evaluates the stored
model again on the run's fixed evaluation sets (what a user loading it gets), and writes the model
card models/NAME/README.md. `models/recreate.sh` holds the commands that made the shipped ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import torch

import latentcode
from latentcode.models import load_model
from latentcode.rundir import RunDirectory
from latentcode.training.evaluate import eval_sets_of, evaluate

MODELS = Path(__file__).resolve().parent


def metrics_table(metrics: dict[str, dict[str, float]]) -> str:
    keys = [k for k in next(iter(metrics.values())) if not k.startswith("feature_accuracy_")]
    lines = ["| split | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for split, values in metrics.items():
        lines.append(f"| {split} | " + " | ".join(f"{values[k]:.4f}" for k in keys) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("name")
    parser.add_argument("--command", required=True, help="the exact training command, for the model card")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--note", default="",
                        help="a paragraph for the card, e.g. how the training departs from the paper")
    args = parser.parse_args()

    run = latentcode.Run(args.run)
    summary = run.summary
    if summary is None:
        raise SystemExit(f"{args.run} has not finished")
    destination = MODELS / args.name
    if destination.exists():
        if not args.overwrite:
            raise SystemExit(f"{destination} exists; pass --overwrite to replace it")
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    for name in ("config.json", "metrics.jsonl"):
        shutil.copy2(args.run / name, destination / name)
    model = run.load_model()
    model.save(destination / "model", dtype=torch.float16)

    shipped = load_model(destination / "model")
    task = run.task()
    variant = run.config.variant or task.variants[0]
    shipped_metrics = evaluate(shipped, task, eval_sets_of(task, run.config.eval_instances, variant))
    summary["shipped_metrics"] = shipped_metrics
    summary["shipped_weights"] = "float16 (loaded as float32)"
    (destination / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    weights = destination / "model" / "model.safetensors"
    sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()

    config = RunDirectory(args.run).read_raw_config()
    train = config["train"]
    model_config = config["resolved_model_config"]
    card = f"""# {args.name}

A {model_config['attention']} transformer trained on {train['task']['name']} on a 2-core CPU with
latentcode {config['latentcode_version']} (torch {config['torch_version']}), preset `{train['preset']}` at
scale `{train['scale']}`: {summary['steps']:,} steps of {train['batch_size']} instances
({summary['instances']:,} instances) in {summary['wall_seconds'] / 60:.1f} minutes.
{chr(10) + args.note + chr(10) if args.note else ""}
## Training command

```bash
{args.command}
```

`models/recreate.sh` re-creates every shipped model (training, then `python models/ship.py`).

## Metrics per split (fixed evaluation sets of {train['eval_instances']} instances each, variant `{variant}`)

Shipped weights (float16, loaded as float32), evaluated again:

{metrics_table(shipped_metrics)}

At the end of training (float32):

{metrics_table(summary['final_metrics'])}

## Configuration

- task: `{json.dumps(train['task'])}`, trained and evaluated on its `{variant}` variant
- model: `{json.dumps(model_config)}`
- optimizer: AdamW, learning rate {train['learning_rate']}, weight decay {train['weight_decay']} (matrices only),
  warmup {train['warmup_steps']} steps then cosine decay to {train['lr_final_fraction']}x, batch {train['batch_size']},
  gradient clipping {train['grad_clip_norm']}, seed {train['seed']}
- files: `model/` (load with `latentcode.load_model("models/{args.name}/model")`; SHA-256 of
  model.safetensors `{sha256}`), `config.json` (the run's full config), `metrics.jsonl` (training
  curves), `summary.json`.

Use it: `latentcode extract models/{args.name} --split {task.analysis.held_out_split} --n 8192 --sites \
{task.analysis.selector} --out codes.h5`
(a run directory), `latentcode report models/{args.name}`, or `latentcode demo --task {task.name}`, which
starts from these checkpoints.
"""
    (destination / "README.md").write_text(card)
    print(f"shipped {destination}: {weights.stat().st_size / 1e6:.2f} MB")
    print(metrics_table(shipped_metrics))


if __name__ == "__main__":
    main()
