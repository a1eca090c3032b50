"""Language modelling: the latent codes of byte-level language models, by token class.

The codes of the last token of a window attending to each of its most recent tokens (`last-recent`:
one row of the attention pattern, every layer), on windows of the corpus's `train` and `validation`
bytes at `--seq-len` (default: the models' own), extracted with `latentcode.extract`. Then

1. the toolkit's probes decode, from each layer's codes, the byte class of the last token
   (`query_class`: letter, digit, whitespace, punctuation) and of the byte it must predict
   (`target_class`), fitted on `train`, scored on `validation`, the layer chosen on `train`
   (`query_class.csv`/`.png`, `target_class.csv`/`.png`; a label with a class too rare to
   cross-validate is skipped with a note);
2. per window, the code of the last token attending to a key chosen by token class -- the previous
   occurrence of its own byte, the previous space, the previous newline -- is gathered from that row
   (the labels give the key's position). For each class of key and each layer:
   - a logistic probe on the code (one number per head) tells such a key from the key at the same
     distance in another window where that is not the window's key of the class (distance-matched
     negatives, half the examples each, so chance is 0.5), fitted on `train` pairs and scored on
     `validation` pairs, beside the same probe fitted to shuffled labels (`key_class_probe.csv`);
   - the mean code per head at such keys minus the mean at the matched keys, in standard deviations
     of that head's codes (`key_class_mean_difference.csv`): which heads attend there.

Writes `language_codes.png` (probe accuracy by layer; mean difference per head) and
`language_codes.md`.

    python analyses/language_codes.py --scale cpu
    python analyses/language_codes.py --runs-from runs      # finished runs runs/language-<attention>
"""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import common
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

KEY_CLASSES = ("previous_occurrence", "previous_space", "previous_newline")
SPLITS = ("train", "validation")


def codes_file(run: Path, seq_len: int | None, n: int, out: Path, batch_size: int, quiet: bool) -> Path:
    """The run's `last-recent` codes on both splits at `seq_len`, extracted once into `out/codes/`."""
    import latentcode

    task = dict(latentcode.Run(run).config.task)
    task["seq_len"] = seq_len or task["seq_len"]
    path = out / "codes" / run.name / f"last-recent-T{task['seq_len']}-{n}.h5"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        for index, split in enumerate(SPLITS):
            latentcode.extract(run, task=task, sites="last-recent", split=split, n=n, out=path,
                               batch_size=batch_size, append=index > 0, progress=not quiet)
    return path


def recent_codes(code_file, layer: int, split: str) -> np.ndarray:
    """float64 ``[n, recent, head]``: the codes of the last query at key offsets 0 (itself), 1, ..."""
    sites = sorted(code_file.sites_of_layer(layer), key=lambda site: -site.key)
    query = sites[0].query
    if any(site.query != query or site.key != query - offset for offset, site in enumerate(sites)):
        raise SystemExit(f"{code_file.path}: layer {layer} holds no `last-recent` row of sites")
    return np.stack([code_file.codes(site, split) for site in sites], axis=1).astype(np.float64)


def key_offsets(code_file, key_class: str, split: str, query: int, n_recent: int) -> np.ndarray:
    """int ``[n]``: how far back the key of `key_class` is from the query, -1 where it lies outside
    the recorded row (or the window has none)."""
    position = code_file.labels(key_class, split).astype(np.int64)
    offset = query - position
    return np.where((position >= 0) & (offset < n_recent), offset, -1)


def matched_pairs(codes: np.ndarray, offsets: np.ndarray, rng: np.random.Generator):
    """Codes ``[2m, head]`` and labels ``[2m]``: the code at each window's key of the class (1) and the
    code at the same offset in another window whose key there is not of the class (0)."""
    positive = np.flatnonzero(offsets >= 0)
    partners = []
    for window in positive:
        for _ in range(100):  # another window whose key at this offset is not of the class
            other = int(rng.integers(len(offsets)))
            if other != window and offsets[other] != offsets[window]:
                partners.append(other)
                break
        else:
            raise SystemExit("too few windows to draw distance-matched negatives; raise --n-codes")
    partners = np.array(partners, dtype=np.int64)
    features = np.concatenate([codes[positive, offsets[positive]], codes[partners, offsets[positive]]])
    labels = np.concatenate([np.ones(len(positive), np.int64), np.zeros(len(partners), np.int64)])
    return features, labels


def key_class_tables(code_files: dict[str, Path], seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The probe table and the mean-difference table of step 2 (see the module docstring)."""
    from threadpoolctl import threadpool_limits

    import latentcode
    from latentcode.analysis.probes import LogisticProbe

    probe_rows, mean_rows = [], []
    for model, path in code_files.items():
        code_file = latentcode.CodeFile(path)
        query = code_file.sites[0].query
        for layer in code_file.layers:
            codes = {split: recent_codes(code_file, layer, split) for split in SPLITS}
            n_recent, n_heads = codes["train"].shape[1:]
            scale = codes["train"].reshape(-1, n_heads).std(axis=0)
            for key_class in KEY_CLASSES:
                rng = np.random.default_rng([seed, layer, KEY_CLASSES.index(key_class)])
                offsets = {split: key_offsets(code_file, key_class, split, query, n_recent) for split in SPLITS}
                pairs = {split: matched_pairs(codes[split], offsets[split], rng) for split in SPLITS}
                (fit_codes, fit_labels), (test_codes, test_labels) = pairs["train"], pairs["validation"]
                row = {"model": model, "layer": layer, "key_class": key_class, "n_fit": len(fit_labels),
                       "n_test": len(test_labels), "chance": 0.5}
                if min(np.bincount(fit_labels, minlength=2)) >= 3 and len(test_labels):
                    with threadpool_limits(limits=1):
                        probe = LogisticProbe(random_state=seed).fit(fit_codes, fit_labels)
                        shuffled = LogisticProbe(random_state=seed).fit(fit_codes, rng.permutation(fit_labels))
                    row |= {"accuracy": float((probe.predict(test_codes) == test_labels).mean()),
                            "validation": float((probe.validation_predictions_ == fit_labels).mean()),
                            "shuffled_labels": float((shuffled.predict(test_codes) == test_labels).mean())}
                probe_rows.append(row)
                difference = fit_codes[fit_labels == 1].mean(axis=0) - fit_codes[fit_labels == 0].mean(axis=0)
                for head in range(n_heads):
                    mean_rows.append({"model": model, "layer": layer, "key_class": key_class, "head": head,
                                      "difference_in_sd": float(difference[head] / scale[head]) if scale[head] > 0
                                      else float("nan")})
    return pd.DataFrame(probe_rows), pd.DataFrame(mean_rows)


def plot(probes: pd.DataFrame, means: pd.DataFrame, context: str) -> Figure:
    """Probe accuracy by layer (top) and the mean-difference heatmaps (bottom, one signed colour
    scale for all three, values written in the cells); `context` heads the title."""
    models = list(dict.fromkeys(probes["model"]))
    limit = float(np.nanmax(np.abs(means["difference_in_sd"].to_numpy()))) if len(means) else 1.0
    figure = Figure(figsize=(4.2 * len(KEY_CLASSES), 7.8))
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, len(KEY_CLASSES), squeeze=False)
    for column, key_class in enumerate(KEY_CLASSES):
        axis = axes[0, column]
        for model in models:
            rows = probes[(probes["model"] == model) & (probes["key_class"] == key_class)]
            if "accuracy" in rows:
                line, = axis.plot(rows["layer"], rows["accuracy"], marker="o", label=model)
                axis.plot(rows["layer"], rows["shuffled_labels"], linestyle=":", marker="x", color=line.get_color())
        axis.axhline(0.5, color="grey", linewidth=0.8)
        axis.set_xticks(sorted(probes["layer"].unique()))
        axis.set(title=f"key: {key_class.replace('_', ' ')}", xlabel="layer", ylim=(0.3, 1.02),
                 ylabel="probe accuracy (validation)" if column == 0 else None)
        axis.legend(fontsize=8, title="x: shuffled labels", title_fontsize=7)
        table = means[means["key_class"] == key_class].pivot_table(index=["model", "layer"], columns="head",
                                                                     values="difference_in_sd", sort=False)
        axis = axes[1, column]
        values = table.to_numpy()
        image = axis.imshow(values, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        for (row, head), value in np.ndenumerate(values):
            axis.text(head, row, f"{value:.1f}", ha="center", va="center", fontsize=7,
                      color="white" if abs(value) > 0.6 * limit else "black")
        axis.set_yticks(range(len(table)), [f"{model} L{layer}" for model, layer in table.index], fontsize=8)
        axis.set_xticks(range(values.shape[1]))
        axis.set(xlabel="head", title="mean code there minus at matched keys\n(SD of the head's codes; train pairs)")
        figure.colorbar(image, ax=axis, shrink=0.8)
    lines = ["The last token's latent code at keys chosen by token class", *textwrap.wrap(context, 150),
             "top: probe fitted on train pairs, scored on validation pairs (chance 0.5: the pairs are balanced); "
             "x, dotted: the same probe fitted to shuffled labels"]
    figure.suptitle("\n".join(lines), fontsize=10)
    figure.tight_layout()
    return figure


def main() -> None:
    parser = common.parser(__doc__, "language_codes")
    parser.add_argument("--seq-len", type=int, help="window length the codes are read at (default: the models' "
                        "own; at most their n_ctx)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass when extracting "
                        "(default 16: HYLA holds a [batch, query, key, width] tensor per head)")
    args = parser.parse_args()

    import latentcode
    from latentcode.analysis import (
        decode,
        headline_lines,
        plot_probe_scores,
        summary_rows,
        write_table,
    )
    from latentcode.analysis.probes import ProbeError
    from latentcode.errors import LatentcodeError

    out = Path(args.out)
    runs = common.model_runs(args, "language")
    try:
        files = {attention: codes_file(Path(run), args.seq_len, args.n_codes, out, args.batch_size, args.quiet)
                 for attention, run in runs.items()}
    except LatentcodeError as error:
        raise SystemExit(f"error: {error}") from None
    lines, decoded = [], {}
    for label in ("query_class", "target_class"):
        try:
            table = decode(list(files.values()), label, fit_split="train", test_split="validation",
                           progress=not args.quiet)
        except ProbeError as error:
            lines.append(f"{label}: not decoded ({error})")
            print(lines[-1])
            continue
        decoded[label] = table
        print(summary_rows(table)[["model", "layer", "metric", "value", "selected", "strongest_baseline_value"]]
              .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        lines += headline_lines(table)

    probes, means = key_class_tables(files, seed=0)
    seq_lens = sorted({latentcode.CodeFile(path).task_config["seq_len"] for path in files.values()})
    context = (f"{', '.join(files)} byte-level models, last-recent sites (the last query to its most recent keys), "
               f"T = {'/'.join(map(str, seq_lens))}, {args.n_codes} windows per split")
    shown = [column for column in ("model", "layer", "key_class", "accuracy", "shuffled_labels", "n_fit", "n_test")
             if column in probes]
    figure_path = out / "language_codes.png"
    # One set: latentcode.analysis's writers lock each table's own stem, so each label's table and figure
    # join a set of that stem, held open (all or none) until the script's own outputs are written too.
    with contextlib.ExitStack() as sets:
        outputs = sets.enter_context(common.output_set(out / "language_codes"))
        for label, table in decoded.items():
            sets.enter_context(common.output_set(out / label))
            write_table(table, out / label)
            plot_probe_scores(table, out / label, metric="accuracy")
        common.write_tables(outputs, probes, out / "key_class_probe")
        common.write_tables(outputs, means, out / "key_class_mean_difference")
        outputs.write_figure(figure_path.with_suffix(""), plot(probes, means, context), dpi=120)
        outputs.write_text(out / "language_codes.md",
                           "# Latent codes of byte-level language models\n\n" + "\n".join(f"- {line}" for line in lines)
                           + "\n\n## Keys chosen by token class (distance-matched probe, chance 0.5)\n\n"
                           + common.markdown_table(probes[shown]) + f"\n![{figure_path.stem}]({figure_path.name})\n")
    print(probes[shown].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\n".join(lines))
    print(f"wrote {out / 'language_codes.md'} and {figure_path}")


if __name__ == "__main__":
    main()
