"""Language modelling: the paper's Fig. 6 at CPU scale (two windows, and a budget where every model
learns beyond the previous byte), the n-gram baselines, and the latent codes of the shipped models."""

from __future__ import annotations

import argparse
import functools
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import RESULTS, ROOT
from .plan import ATTENTIONS
from .recorded import draw_curves, eval_records, metric_of, minutes, recorded_run, summary_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LANGUAGE = RESULTS / "language"


@functools.cache
def language_baselines() -> dict[str, float]:
    """Bits per byte on the validation bytes of byte n-gram models counted on the training bytes
    (add-one smoothing): what the next byte costs knowing no context (unigram) or only the byte
    before it (bigram). A language model that is no better has learned nothing from its context."""
    from latentcode.tasks import corpus_split

    train_bytes, validation = (corpus_split(split).astype(np.int64) for split in ("train", "validation"))
    unigram = np.bincount(train_bytes, minlength=256) + 1.0
    bigram = np.bincount(train_bytes[:-1] * 256 + train_bytes[1:], minlength=256 * 256).reshape(256, 256) + 1.0
    unigram_bits = -np.log2(unigram[validation] / unigram.sum()).mean()
    following = validation[1:]
    bigram_bits = -np.log2(bigram[validation[:-1], following] / bigram[validation[:-1]].sum(axis=1)).mean()
    return {"unigram (no context)": float(unigram_bits), "bigram (the previous byte)": float(bigram_bits)}


def language_parameters(name: str) -> int:
    """Parameters of the recorded run's model, built from its config (no weights needed)."""
    from latentcode.models import ModelConfig, build_model

    config = recorded_run(name).config["resolved_model_config"]
    return sum(parameter.numel() for parameter in build_model(ModelConfig(**config)).parameters())


# Windows of the language runs: (suffix of the run name, window bytes, windows per step).
LANGUAGE_WINDOWS = (("", 512, 8), ("-T128", 128, 32))


def language_table() -> tuple[str, Figure]:
    """Final bits per byte (validation and train windows), next-byte accuracy, parameters and wall
    time of each model and window, beside the n-gram baselines; and the figure of the curves, one
    panel per window on one scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines = ["| model | window (bytes) | validation bits per byte | train bits per byte | "
             "validation next-byte accuracy (%) | parameters | wall time (min) |", "|---|---|---|---|---|---|---|"]
    figure = Figure(figsize=(11, 4.2), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(LANGUAGE_WINDOWS), sharey=True)
    baselines = language_baselines()
    for axis, (suffix, window, per_step) in zip(axes, LANGUAGE_WINDOWS, strict=True):
        for index, attention in enumerate(ATTENTIONS):
            name = f"language-{attention}{suffix}-s0"
            summary = summary_of(name)
            if summary is None:
                lines.append(f"| {attention} | {window} | not trained yet | | | | |")
                continue
            final = summary["final_metrics"]
            lines.append(f"| {attention} | {window} | {final['validation']['bits_per_byte']:.3f} | "
                         f"{final['train']['bits_per_byte']:.3f} | {100 * final['validation']['accuracy']:.1f} | "
                         f"{language_parameters(name):,} | {summary['wall_seconds'] / 60:.0f} |")
            draw_curves(axis, name, "bits_per_byte", ("validation", "train"), f"C{index}", attention)
        for (name, bits), style in zip(baselines.items(), (":", "-."), strict=True):
            axis.axhline(bits, color="grey", linestyle=style, linewidth=0.9, label=f"{name.split(' (')[0]} baseline")
        axis.set(xlabel=f"training step ({per_step} windows of {window} bytes)", ylim=(1.0, 5.0),
                 title=f"windows of {window} bytes")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("bits per byte")
    figure.suptitle("Byte-level language modelling, King James Bible, 2 layers, seed 0, scale cpu: validation "
                    "(last 10% of the bytes, solid) and training windows (dashed)", fontsize=10)
    for name, bits in baselines.items():
        lines.append(f"| *baseline: {name}* | | {bits:.3f} | | | | |")
    figure.tight_layout()
    return "\n".join(lines), figure


LANGUAGE_BUDGET_SEEDS = (0, 1)
LANGUAGE_BUDGET_MARGIN = 0.3  # bits per byte below the bigram baseline that count as "learned beyond it"


def language_budget_bits() -> dict[str, list[float]]:
    """Validation bits per byte of the issue-26 runs (4,000 steps, windows of 128), per model and seed."""
    bits = {}
    for attention in ATTENTIONS:
        values = [metric_of(f"language-{attention}-T128-4k-s{seed}", "validation", "bits_per_byte")
                  for seed in LANGUAGE_BUDGET_SEEDS]
        bits[attention] = [value / 100 for value in values if value is not None]
    return bits


def language_budget_table() -> tuple[str, Figure]:
    """The runs at a budget where the models learn beyond the previous byte: 4,000 steps of 32 windows
    of 128 bytes (16.4M bytes, about 4 passes), seeds 0 and 1; and the figure of their curves (seed 0
    solid, seed 1 dashed; validation)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bigram = language_baselines()["bigram (the previous byte)"]
    lines = ["| model | seeds | validation bits per byte (each seed) | mean | below the bigram by | "
             "validation next-byte accuracy (%) | wall time per run (min) |", "|---|---|---|---|---|---|---|"]
    figure = Figure(figsize=(7, 4.4), dpi=110)
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    for index, (attention, values) in enumerate(language_budget_bits().items()):
        names = [f"language-{attention}-T128-4k-s{seed}" for seed in LANGUAGE_BUDGET_SEEDS]
        trained = [name for name in names if summary_of(name)]
        if not trained:
            lines.append(f"| {attention} | – | not trained yet | | | | |")
            continue
        accuracy = [summary_of(name)["final_metrics"]["validation"]["accuracy"] * 100 for name in trained]
        mean = float(np.mean(values))
        lines.append(f"| {attention} | {', '.join(name.rsplit('-s', 1)[1] for name in trained)} | "
                     f"{', '.join(f'{value:.3f}' for value in values)} | {mean:.3f} | {bigram - mean:.3f} | "
                     f"{np.mean(accuracy):.1f} | {minutes(trained)} |")
        for name, style in zip(names, ("-", "--"), strict=True):
            if summary_of(name):
                evals = eval_records(name)
                axis.plot([r["step"] for r in evals], [r["splits"]["validation"]["bits_per_byte"] for r in evals],
                          style, color=f"C{index}", label=f"{attention}, seed {name.rsplit('-s', 1)[1]}")
    for (name, bits), style in zip(language_baselines().items(), (":", "-."), strict=True):
        axis.axhline(bits, color="grey", linestyle=style, linewidth=0.9, label=f"{name.split(' (')[0]} baseline")
    axis.set(xlabel="training step (32 windows of 128 bytes)", ylabel="validation bits per byte", ylim=(1.0, 5.0))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, ncol=2)
    figure.suptitle("Byte-level language modelling (King James Bible), 2 layers, scale cpu, 4,000 steps\n"
                    "validation bits per byte on the last 10% of the bytes, seeds 0 (solid) and 1 (dashed)", fontsize=9)
    figure.tight_layout()
    lines.append(f"| *baseline: bigram (the previous byte)* | | {bigram:.3f} | | | | |")
    return "\n".join(lines), figure


def language_codes_section() -> str:
    """The recorded output of analyses/language_codes.py on the shipped language models, if any."""
    table = LANGUAGE / "language_codes.md"
    if not table.is_file():
        return "Not measured yet: `python analyses/reproduce.py language-codes`, then `page`."
    body = table.read_text().split("\n", 1)[1].replace("](language_codes.png)",
                                                       "](results/language/language_codes.png)")
    body = body.replace("\n## ", "\n### ")  # its sections sit inside the page's Fig. 6 section
    return body.strip()


def language_codes(args: argparse.Namespace) -> None:
    """Run analyses/language_codes.py on the shipped language models at T = 512 and record its
    tables and figures in results/language/."""
    from latentcode.files import AtomicOutputs

    out = Path(args.out) / "language-codes"
    command = ["python", str(ROOT / "language_codes.py"), "--runs-from", args.models, "--run-name",
               "language-{attention}",
               "--out", str(out), "--quiet", "--n-codes", str(args.n_codes), "--seq-len", "512"]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    with AtomicOutputs(lock=LANGUAGE / "language_codes", purpose="recording the language codes") as outputs:
        for file in sorted(out.iterdir()):
            if file.suffix in (".csv", ".png", ".md"):
                outputs.write_bytes(LANGUAGE / file.name, file.read_bytes())
