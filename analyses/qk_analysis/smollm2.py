"""The SmolLM2 half of `analyses/qk_findings.py` (issue 48): the query-key terms of the induction heads at
induction and non-induction pairs of repeated random tokens, the previous-token score of the components
that carry them, and the path-patching check beside equal-norm controls. Run through `qk_findings.py`.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from latentcode.intervention.qk import decompose, path_patch, read_head
from qk_analysis.controls import equal_norm_controls, parse_head

TOP = 8  # components per side in the figure's panels


def previous_token_scores(model, tokens: torch.Tensor) -> np.ndarray:
    """`[layer, head]` mean attention from t to t - 1 (t >= 1) on `tokens` `[1, T]`: the standard
    previous-token score, from q_proj/k_proj outputs and RoPE (the model's own pattern, recomputed)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    captured: dict = {}
    layers = model.model.layers
    handles = [model.model.rotary_emb.register_forward_hook(lambda m, i, o: captured.update(cos=o[0], sin=o[1]))]
    for index, layer in enumerate(layers):
        handles.append(layer.self_attn.q_proj.register_forward_hook(
            lambda m, i, o, index=index: captured.update({f"q{index}": o})))
        handles.append(layer.self_attn.k_proj.register_forward_hook(
            lambda m, i, o, index=index: captured.update({f"k{index}": o})))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    n = tokens.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = []
    for index, layer in enumerate(layers):
        attention = layer.self_attn
        q = captured[f"q{index}"].view(1, n, -1, attention.head_dim).transpose(1, 2)
        k = captured[f"k{index}"].view(1, n, -1, attention.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, captured["cos"], captured["sin"])
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        pattern = torch.softmax((q @ k.transpose(-1, -2) * attention.scaling).masked_fill(~causal, float("-inf")), -1)
        scores.append(pattern[0, :, torch.arange(1, n), torch.arange(0, n - 1)].mean(-1).float().numpy())
    return np.stack(scores)


def repeated_loss(half: int):
    """Mean next-token cross-entropy of the second copy's predictions whose target has an earlier
    occurrence: logits at 1 + half .. 2 half - 1 predict tokens 2 + half .. 2 half (bos at 0)."""
    def make(tokens: torch.Tensor):
        targets = tokens[0, half + 2:]
        return lambda output: F.cross_entropy(getattr(output, "logits", output)[0, half + 1:-1].float(), targets)
    return make


def run(args, say) -> dict:
    from latentcode.pretrained import load_pretrained
    from latentcode.tasks import repeated_random_tokens

    started = time.time()
    pretrained = load_pretrained("smollm2")
    model, tokenizer = pretrained.model, pretrained.tokenizer
    torch.manual_seed(args.seed)
    heads = [tuple(int(x) for x in spec.split(".")) for spec in args.heads]
    others = [(layer, head) for layer in sorted({layer for layer, _ in heads}) for head in range(pretrained.n_heads)
              if (layer, head) not in heads]
    control = random.Random(args.seed).choice(others)  # a head of the same layers that is none of the induction heads
    low = max(tokenizer.all_special_ids) + 1  # ordinary tokens only
    sequences = repeated_random_tokens(args.n, args.half, len(tokenizer), args.seed, tokenizer.bos_token_id, low)
    half = args.half
    loss_of = repeated_loss(half)
    marginal_rows, patch_rows, previous_all = [], [], []
    mean_terms: dict = {}
    for index, sequence in enumerate(sequences):
        tokens = torch.as_tensor(sequence)[None]
        previous = previous_token_scores(model, tokens)
        previous_all.append(previous)
        queries = torch.arange(half + 1, 2 * half + 1)
        induction = torch.stack([queries, queries - half + 1], 1)  # tokens[k - 1] == tokens[q]
        generator = torch.Generator().manual_seed(args.seed * 1000 + index)
        keys = torch.stack([torch.randint(1, int(q) + 1, (1,), generator=generator)[0] for q in queries])
        keys = torch.where(keys == queries - half + 1, keys - 1, keys)  # never the induction key; never bos (k >= 1)
        keys = keys.clamp_min(1)
        other = torch.stack([queries, keys], 1)
        for layer, head in [*heads, control]:
            name = f"{layer}.{head}"
            reading, _ = read_head(model, tokens, layer, head)
            for kind, pairs in (("induction", induction), ("non-induction", other)):
                terms = decompose(reading, pairs)
                mean = terms.terms.double().mean(0)
                mean_terms.setdefault((name, kind), ([], terms.names))[0].append(mean)
                key_side = mean.sum(0)
                query_side = mean.sum(1)
                for c, component in enumerate(terms.names):
                    source = parse_head(component)
                    marginal_rows.append(dict(head=name, pairs=kind, sequence=index, component=component,
                                              key_marginal=float(key_side[c]), query_marginal=float(query_side[c]),
                                              score=float(terms.scores.double().mean()),
                                              previous_token_score=float(previous[source]) if source else np.nan))
                if kind != "induction":
                    continue
                top = terms.names[int(key_side.abs().argmax())]
                rng = np.random.default_rng([args.seed, index, layer, head])
                loss = loss_of(tokens)
                removals = {"top key-side component": (top, None), **equal_norm_controls(reading, top, rng)}
                for label, (described, vectors) in removals.items():
                    patch = path_patch(model, tokens, reading, terms, top, "key", loss, removed=vectors)
                    for scale in ("frozen", "recomputed"):
                        patch_rows.append(dict(head=name, sequence=index, removal=label, component=described,
                                               top_component=top, scale=scale,
                                               score_change=float(patch.score_change[scale].double().mean()),
                                               predicted=float(patch.predicted.double().mean()),
                                               code_change=float(patch.code_change[scale].double().mean()),
                                               loss_change=patch.loss_change[scale]))
        say(f"smollm2: sequence {index + 1}/{len(sequences)} ({time.time() - started:.0f} s)")
    with torch.no_grad():
        base_losses = [float(loss_of(torch.as_tensor(s)[None])(model(torch.as_tensor(s)[None]))) for s in sequences]
    previous_all = np.stack(previous_all)  # [sequence, layer, head]
    panels = {key: (torch.stack(means).mean(0).numpy(), names) for key, (means, names) in mean_terms.items()}
    return dict(marginals=pd.DataFrame(marginal_rows), patches=pd.DataFrame(patch_rows), previous=previous_all,
                panels=panels, heads=[f"{layer}.{head}" for layer, head in heads], control=f"{control[0]}.{control[1]}",
                base_loss=base_losses, n=len(sequences), half=half, seconds=time.time() - started)



def tables(result: dict) -> dict[str, pd.DataFrame]:
    """The aggregated tables: key/query marginals and previous-token scores with s.e. over sequences,
    the path patches, the previous-token scores of every head, the panels' mean terms."""
    from qk_analysis.controls import grouped, listed, mean_se, top_indices

    marginals = result["marginals"]
    rows = []
    for (head, kind, component), block in marginals.groupby(["head", "pairs", "component"], sort=False):
        key, key_se, n = mean_se(block["key_marginal"])
        query, query_se, _ = mean_se(block["query_marginal"])
        previous, previous_se, _ = mean_se(block["previous_token_score"])
        rows.append(dict(head=head, pairs=kind, component=component, key_marginal=key, key_marginal_se=key_se,
                         query_marginal=query, query_marginal_se=query_se, previous_token_score=previous,
                         previous_token_score_se=previous_se, n=n))
    marginal_table = pd.DataFrame(rows)
    patches = result["patches"]
    rows = []
    for (head, removal, scale), block in patches.groupby(["head", "removal", "scale"], sort=False):
        row = dict(head=head, removal=removal, scale=scale, components=listed(block["component"], "sequence"),
                   top_components=" ".join(sorted(set(block["top_component"]))))
        for what in ("score_change", "predicted", "code_change", "loss_change"):
            row[what], row[what + "_se"], row["n"] = mean_se(block[what])
        rows.append(row)
    patch_table = pd.DataFrame(rows)
    previous = result["previous"]
    previous_table = pd.DataFrame([dict(layer=layer, head=head,
                                        previous_token_score=float(previous[:, layer, head].mean()),
                                        se=float(previous[:, layer, head].std(ddof=1) / np.sqrt(len(previous))))
                                   for layer in range(previous.shape[1]) for head in range(previous.shape[2])])
    panel_rows = []
    for head in [*result["heads"], result["control"]]:
        matrix, names = result["panels"][(head, "induction")]
        chosen = top_indices(matrix, names, TOP)
        for kind in ("induction", "non-induction"):
            matrix, names = result["panels"][(head, kind)]
            row_names, column_names, values = grouped(matrix, names, *chosen)
            panel_rows += [dict(head=head, pairs=kind, query_component=r, key_component=c, mean_term=values[i, j])
                           for i, r in enumerate(row_names) for j, c in enumerate(column_names)]
    return dict(marginals=marginal_table, patches=patch_table, previous_token=previous_table,
                terms=pd.DataFrame(panel_rows))


def figures(result: dict, frames: dict) -> dict:
    """The query x key panels (rows: induction and non-induction pairs; columns: the heads), one colour
    scale; and the path patches' effects beside their controls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from qk_analysis.controls import heatmaps

    terms = frames["terms"]
    heads = [*result["heads"], result["control"]]
    panels = []
    for kind in ("induction", "non-induction"):
        for head in heads:
            block = terms[(terms["head"] == head) & (terms["pairs"] == kind)]
            rows = list(dict.fromkeys(block["query_component"]))
            columns = list(dict.fromkeys(block["key_component"]))
            matrix = block["mean_term"].to_numpy().reshape(len(rows), len(columns))
            label = "random head" if head == result["control"] else "induction head"
            panels.append((f"{head} ({label}), {kind}", rows, columns, matrix))
    terms_figure = heatmaps(panels, f"SmolLM2-135M: mean query-key terms, {result['n']} sequences of bos + 2 x "
                            f"{result['half']} random tokens (components chosen at induction pairs)", len(heads))
    patches = frames["patches"]
    frozen = patches[patches["scale"] == "frozen"]
    removals = list(dict.fromkeys(frozen["removal"]))
    effects, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    width = 0.8 / len(removals)
    for r, removal in enumerate(removals):
        block = frozen[frozen["removal"] == removal].set_index("head").reindex(heads)
        for axis, what in zip(axes, ("code_change", "loss_change"), strict=True):
            axis.bar(np.arange(len(heads)) + (r - (len(removals) - 1) / 2) * width, block[what], width,
                     yerr=block[what + "_se"], capsize=2, label=removal)
    for axis, label in zip(axes, ("change of the induction code (mean over pairs)",
                                  "change of the loss on repeated tokens (nats)"), strict=True):
        axis.set_xticks(range(len(heads)), [f"{h}{' (random)' if h == result['control'] else ''}" for h in heads])
        axis.axhline(0, color="black", linewidth=0.6)
        axis.set_ylabel(label, fontsize=8)
        axis.set_xlabel("head (layer.head)")
    effects.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    effects.suptitle(f"SmolLM2-135M: key side of each head path-patched (scale frozen), mean ± s.e. over "
                     f"{result['n']} sequences", fontsize=10)
    return {"smollm2_qk_terms": terms_figure, "smollm2_patch_effects": effects}


def markdown(result: dict, frames: dict) -> str:
    """The SmolLM2 section of the findings: numbers with standard errors over sequences."""
    from qk_analysis.controls import mean_se

    marginals, patches, previous = frames["marginals"], frames["patches"], frames["previous_token"]
    loss, loss_se, n = mean_se(result["base_loss"])
    heads, control = result["heads"], result["control"]
    lines = [f"SmolLM2-135M-Instruct, {n} sequences of bos + {result['half']} distinct random ordinary tokens, then "
             f"the same {result['half']} again (T = {2 * result['half'] + 1}). Heads: {', '.join(heads)} (the "
             f"induction heads of the SmolLM2 page) and {control}, drawn at random (seeded) from their layers. "
             f"Induction pairs: each query q of the second copy and its key q - {result['half'] - 1} (the token after "
             "the query's first occurrence); non-induction pairs: the same queries, one key drawn uniformly from 1..q "
             "other than that (never bos). Previous-token score: a head's mean attention from t to t - 1 on the same "
             f"sequences. Mean ± s.e. over sequences. Loss on the repeated tokens (the {result['half'] - 1} "
             "predictions of the second copy whose target occurred before), unedited: "
             f"{loss:.3f} ± {loss_se:.3f} nats.", ""]
    earlier = previous[previous["layer"] < min(int(h.split(".")[0]) for h in [*heads, control])]
    ranked = earlier.sort_values("previous_token_score", ascending=False)
    lines.append("Heads before layer 17 with the highest previous-token score: " + ", ".join(
        f"L{int(r.layer)}.H{int(r.head)} {r.previous_token_score:.2f}" for r in ranked.head(5).itertuples())
        + f" (median over those {len(earlier)} heads: {earlier['previous_token_score'].median():.2f}).")
    lines += ["", "| head | pairs | score | top key-side components: key marginal ± s.e. (previous-token score) |",
              "|---|---|---|---|"]
    for head in [*heads, control]:
        for kind in ("induction", "non-induction"):
            block = marginals[(marginals["head"] == head) & (marginals["pairs"] == kind)]
            score = result["marginals"]
            score = score[(score["head"] == head) & (score["pairs"] == kind) & (score["component"] == "embed")]["score"]
            mean, se, _ = mean_se(score)
            top = block.reindex(block["key_marginal"].abs().sort_values(ascending=False).index).head(5)
            parts = [f"{r.component} {r.key_marginal:+.2f} ± {r.key_marginal_se:.2f}"
                     + (f" ({r.previous_token_score:.2f})" if np.isfinite(r.previous_token_score) else "")
                     for r in top.itertuples()]
            label = f"{head} (random head)" if head == control else head
            lines.append(f"| {label} | {kind} | {mean:+.2f} ± {se:.2f} | {'; '.join(parts)} |")
    lines += ["", "Path patching the key side of each head at its induction pairs (per sequence, the component with "
              "the largest |key marginal| there, beside two controls of the same norm at every position: a random "
              "Gaussian direction, and another head of the same layer, drawn at random, rescaled), scale frozen / "
              "recomputed:", "",
              "| head | removed from the key side | components | score change (predicted) | induction code change | "
              "loss change (nats) | n |", "|---|---|---|---|---|---|---|"]
    for head in [*heads, control]:
        for removal in dict.fromkeys(patches["removal"]):
            both = patches[(patches["head"] == head) & (patches["removal"] == removal)].set_index("scale")
            if len(both) == 0:
                continue
            f, r = both.loc["frozen"], both.loc["recomputed"]
            lines.append(f"| {head} | {removal} | {f.components} | {f.score_change:+.2f} ± {f.score_change_se:.2f} "
                         f"({f.predicted:+.2f}) / {r.score_change:+.2f} | {f.code_change:+.3f} ± {f.code_change_se:.3f}"
                         f" / {r.code_change:+.3f} ± {r.code_change_se:.3f} | {f.loss_change:+.3f} ± "
                         f"{f.loss_change_se:.3f} / {r.loss_change:+.3f} ± {r.loss_change_se:.3f} | {int(f.n)} |")
    return "\n".join(lines) + "\n"
