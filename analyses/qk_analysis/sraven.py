"""The sraven-hyla half of `analyses/qk_findings.py` (issue 48): which query-side and key-side components
write the rule-selective part of layer 2's codes at the queried feature's context cells, and what
removing the top one does. Run through `qk_findings.py`.

The rule-selective part of a quantity X over instances is its rule-conditional mean minus its grand
mean, d_r(X) = E[X | rule r] - E[X] (the rule being the queried feature's), which is what a linear probe
of the rule reads; its size is the between-rule variance V(X) = sum_r p_r d_r(X)^2. The score is a sum of
terms, so d_r(score) = sum_ij d_r(T_ij) exactly, and the between-rule variance splits exactly over
the components: share_ij = sum_r p_r d_r(T_ij) d_r(score) / V(score), which sum to 1 (marginals: the
query side sums over j, the key side over i).
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from latentcode.intervention.qk import decompose, path_patch, read_head
from qk_analysis.controls import NOT_IN_THE_STREAM, equal_norm_controls

MODEL = "models/sraven-hyla"
LAYER = 2
QUERIES, KEYS = (7, 11, 19, 23), (3, 7, 11, 15, 19)  # `latentcode patch models/sraven-hyla --search`
TOP = 8


def between_rule(values: np.ndarray, rules: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d `[rule, ...]`, p `[rule]`): rule-conditional means minus the grand mean of `values` `[n, ...]`."""
    present = np.unique(rules)
    p = np.array([np.mean(rules == r) for r in present])
    grand = values.mean(0)
    d = np.stack([values[rules == r].mean(0) - grand for r in present])
    return d, p


def variance(values: np.ndarray, rules: np.ndarray) -> float:
    d, p = between_rule(values, rules)
    return float((p * d ** 2).sum())


def eta_squared(values: np.ndarray, rules: np.ndarray) -> float:
    return variance(values, rules) / float(values.var())


def codes_at_pairs(model, x: np.ndarray) -> np.ndarray:
    """`[n, head]`: layer 2's codes (hook_pattern) averaged over the group's pairs, batched."""
    captured = []
    attention = model.blocks[LAYER].attn
    handle = attention.hook_pattern.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
    try:
        with torch.no_grad():
            for start in range(0, len(x), 256):
                model(torch.as_tensor(x[start:start + 256]))
    finally:
        handle.remove()
    pattern = torch.cat(captured)  # [n, head, query, key]
    queries, keys = np.meshgrid(QUERIES, KEYS, indexing="ij")
    return pattern[:, :, queries.ravel(), keys.ravel()].mean(-1).double().numpy()


def probe_accuracy(features: np.ndarray, rules: np.ndarray, seed: int) -> tuple[float, float]:
    """5-fold cross-validated accuracy of a logistic-regression probe of the rule, and the majority rate."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    accuracy = cross_val_score(probe, features, rules, cv=5).mean()
    return float(accuracy), float(np.bincount(rules).max() / len(rules))


def run(args, say) -> dict:
    import latentcode
    from latentcode.tasks import RULES

    started = time.time()
    run_ = latentcode.Run(MODEL)
    model, task = run_.load_model().eval(), run_.task()
    feature = task.n_features - 1  # the queried feature: the last query position's
    answer_position = task.seq_len - 1
    selection = task.sample(args.sraven_n, "ood", seed=args.seed + 4, variant="unpermuted")
    rules = selection.labels["query_rule"][:, feature]
    codes = codes_at_pairs(model, selection.x)
    n_heads = codes.shape[1]
    code_eta = np.array([eta_squared(codes[:, h], rules) for h in range(n_heads)])
    probe_all = probe_accuracy(codes, rules, args.seed)
    head = int(np.argmax(code_eta))
    probe_head = probe_accuracy(codes[:, [head]], rules, args.seed)
    say(f"sraven: head {head} has the most rule-selective code (eta^2 {code_eta[head]:.3f}); decomposing")
    pairs = torch.as_tensor([(q, k) for q in QUERIES for k in KEYS])
    terms_all, scores = [], []
    names = None
    for index in range(len(selection.x)):
        reading, _ = read_head(model, torch.as_tensor(selection.x[index]), LAYER, head)
        terms = decompose(reading, pairs)
        names = terms.names
        terms_all.append(terms.terms.double().mean(0).numpy())
        scores.append(float(terms.scores.double().mean()))
    terms_all, scores = np.stack(terms_all), np.array(scores)  # [n, comp, comp], [n]
    d_terms, p = between_rule(terms_all, rules)
    d_score, _ = between_rule(scores, rules)
    total = float((p * d_score ** 2).sum())
    share = np.einsum("r,rij,r->ij", p, d_terms, d_score) / total  # sums to 1
    query_share, key_share = share.sum(1), share.sum(0)
    say(f"sraven: decomposed {len(scores)} instances; path patching on fresh ones")
    stream = [i for i, name in enumerate(names) if name not in NOT_IN_THE_STREAM]
    tops = {"query": names[max(stream, key=lambda i: abs(query_share[i]))],
            "key": names[max(stream, key=lambda i: abs(key_share[i]))]}
    fresh = task.sample(args.sraven_n, "ood", seed=args.seed + 5, variant="unpermuted")
    fresh_rules = fresh.labels["query_rule"][:, feature]
    targets = torch.as_tensor(fresh.y[:, feature])
    rows, patched_codes = [], {}
    base_codes = codes_at_pairs(model, fresh.x)[:, head]
    for index in range(len(fresh.x)):
        tokens = torch.as_tensor(fresh.x[index])
        reading, _ = read_head(model, tokens, LAYER, head)
        terms = decompose(reading, pairs)
        rng = np.random.default_rng([args.seed, index])
        for side, top in tops.items():
            removals = {f"top {side}-side component": (top, None), **equal_norm_controls(reading, top, rng)}
            for label, (described, vectors) in removals.items():
                outputs = []

                def loss(output, outputs=outputs, index=index):
                    outputs.append(output[0, answer_position])
                    return F.cross_entropy(output[0, answer_position][None].float(), targets[index:index + 1])

                patch = path_patch(model, tokens[None], reading, terms, top, side, loss, removed=vectors)
                correct = [float(logits.argmax() == targets[index]) for logits in outputs]  # base, frozen, recomputed
                for s, scale in enumerate(("frozen", "recomputed")):
                    change = patch.code_change[scale].double().mean().item()
                    patched_codes.setdefault((side, label, scale), []).append(base_codes[index] + change)
                    rows.append(dict(instance=index, rule=RULES[fresh_rules[index]], side=side, removal=label,
                                     component=described, top_component=top, scale=scale,
                                     score_change=float(patch.score_change[scale].double().mean()),
                                     predicted=float(patch.predicted.double().mean()), code_change=change,
                                     loss_change=patch.loss_change[scale], accuracy_change=correct[s + 1] - correct[0],
                                     base_correct=correct[0]))
        if (index + 1) % 256 == 0:
            say(f"sraven: path patched {index + 1}/{len(fresh.x)} instances")
    return dict(n=len(scores), n_fresh=len(fresh.x), layer=LAYER, head=head, names=names, code_eta=code_eta,
                probe_all=probe_all, probe_head=probe_head, share=share, d_terms=d_terms, p=p,
                rules_present=[RULES[r] for r in np.unique(rules)], score_eta=eta_squared(scores, rules),
                tops=tops, patches=pd.DataFrame(rows), base_codes=base_codes, fresh_rules=fresh_rules,
                patched_codes=patched_codes, seconds=time.time() - started, terms=terms_all, scores=scores, rules=rules)


def shares_of(terms: np.ndarray, scores: np.ndarray, rules: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query-side, key-side) shares `[component]` of the score's between-rule variance."""
    d_query, p = between_rule(terms.sum(2), rules)
    d_key, _ = between_rule(terms.sum(1), rules)
    d_score, _ = between_rule(scores, rules)
    total = (p * d_score ** 2).sum()
    return np.einsum("r,ri,r->i", p, d_query, d_score) / total, np.einsum("r,ri,r->i", p, d_key, d_score) / total


def tables(result: dict, n_boot: int = 200) -> dict[str, pd.DataFrame]:
    from qk_analysis.controls import grouped, listed, mean_se

    names, share = result["names"], result["share"]
    terms, scores, rules = result["terms"], result["scores"], result["rules"]
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(n_boot):  # s.e. of the shares over instances
        pick = rng.integers(len(scores), size=len(scores))
        boot.append(np.stack(shares_of(terms[pick], scores[pick], rules[pick])))
    boot = np.stack(boot)  # [boot, side, component]
    means = terms.mean(0)
    components = pd.DataFrame(dict(component=names, query_share=share.sum(1), query_share_se=boot[:, 0].std(0, ddof=1),
                                   key_share=share.sum(0), key_share_se=boot[:, 1].std(0, ddof=1),
                                   query_marginal=means.sum(1), key_marginal=means.sum(0)))
    heads = pd.DataFrame(dict(head=np.arange(len(result["code_eta"])), code_eta_squared=result["code_eta"]))
    rows = np.argsort(-np.abs(share.sum(1)))[:TOP].tolist()
    columns = np.argsort(-np.abs(share.sum(0)))[:TOP].tolist()
    panel_rows = []
    panels = [("share of the between-rule variance", share)]
    for r, rule in enumerate(result["rules_present"]):
        panels.append((f"{rule} minus mean (score units)", result["d_terms"][r]))
    for label, matrix in panels:
        row_names, column_names, values = grouped(matrix, names, rows, columns)
        panel_rows += [dict(panel=label, query_component=a, key_component=b, value=values[i, j])
                       for i, a in enumerate(row_names) for j, b in enumerate(column_names)]
    patches = result["patches"]
    base_variance = variance(result["base_codes"], result["fresh_rules"])
    aggregated = []
    for (side, removal, scale), block in patches.groupby(["side", "removal", "scale"], sort=False):
        row = dict(side=side, removal=removal, scale=scale, components=listed(block["component"], "instance"))
        for what in ("score_change", "predicted", "code_change", "loss_change", "accuracy_change"):
            row[what], row[what + "_se"], row["n"] = mean_se(block[what])
        patched = np.array(result["patched_codes"][(side, removal, scale)])
        left = [variance(patched[pick], result["fresh_rules"][pick]) / variance(result["base_codes"][pick],
                                                                                   result["fresh_rules"][pick])
                for pick in (rng.integers(len(patched), size=len(patched)) for _ in range(n_boot))]
        row["rule_variance_left"] = variance(patched, result["fresh_rules"]) / base_variance
        row["rule_variance_left_se"] = float(np.std(left, ddof=1))
        aggregated.append(row)
    base_accuracy = mean_se(patches.drop_duplicates("instance")["base_correct"])
    return dict(components=components, heads=heads, terms=pd.DataFrame(panel_rows),
                patches=pd.DataFrame(aggregated), base=pd.DataFrame([dict(accuracy=base_accuracy[0],
                                                                          accuracy_se=base_accuracy[1],
                                                                          n=base_accuracy[2])]))


def markdown(result: dict, frames: dict) -> str:
    components, patches, base = frames["components"], frames["patches"], frames["base"].iloc[0]
    head, eta = result["head"], result["code_eta"]
    order = np.argsort(-eta)
    probe_all, probe_head = result["probe_all"], result["probe_head"]
    lines = [f"sraven-hyla (unpermuted SRAVEN, M = 4), layer {LAYER}, at the {len(QUERIES)} x {len(KEYS)} pairs "
             f"`latentcode patch models/sraven-hyla --search` found (queries {', '.join(map(str, QUERIES))} x keys "
             f"{', '.join(map(str, KEYS))}: the queried feature's context cells), each code averaged over those "
             f"pairs; {result['n']} OOD instances (seed 4) to choose and decompose, {result['n_fresh']} fresh OOD "
             f"instances (seed 5) to path-patch. The rule: the queried feature's ({len(result['rules_present'])} "
             f"rules present). A logistic-regression probe reads it from the 16 heads' codes at 5-fold cross-validated "
             f"accuracy {probe_all[0]:.3f} (majority {probe_all[1]:.3f}); from head {head}'s code alone "
             f"{probe_head[0]:.3f}. Head {head} has the most rule-selective code: the rule explains eta² = "
             f"{eta[head]:.3f} of its variance (next: " + ", ".join(f"head {h} {eta[h]:.3f}" for h in order[1:4])
             + f"; median over heads {np.median(eta):.3f}), and {result['score_eta']:.3f} of its score's.", "",
             "Shares of the between-rule variance of head " + str(head) + "'s score (they sum to 1 over each side; "
             "s.e. by bootstrap over instances):", "", "| side | top components: share ± s.e. |", "|---|---|"]
    for side in ("query", "key"):
        top = components.reindex(components[f"{side}_share"].abs().sort_values(ascending=False).index).head(6)
        lines.append(f"| {side} | " + "; ".join(f"{r.component} {getattr(r, side + '_share'):+.2f} ± "
                                               f"{getattr(r, side + '_share_se'):.2f}"
                                                for r in top.itertuples()) + " |")
    lines += ["", f"Path patching head {head}: the top component of each side (largest |share| among the stream's "
              "components) removed from that side only, beside a random Gaussian direction and another component "
              "drawn at random (another head of the same layer where the top one is a head), each rescaled to the "
              "removed component's norm at every position. Rule-selective variance left: the between-rule variance "
              "of the head's code after the patch over before (s.e. by bootstrap). Loss and accuracy: the queried "
              f"feature's answer (unedited accuracy {base.accuracy:.3f} ± {base.accuracy_se:.3f}). Scale frozen / "
              "recomputed:", "",
              "| side | removed | components | score change (predicted) | code change | rule-selective variance left | "
              "loss change (nats) | accuracy change | n |", "|---|---|---|---|---|---|---|---|---|"]
    for (side, removal), both in patches.groupby(["side", "removal"], sort=False):
        both = both.set_index("scale")
        f, r = both.loc["frozen"], both.loc["recomputed"]
        lines.append(f"| {side} | {removal} | {f.components} | {f.score_change:+.3f} ± {f.score_change_se:.3f} "
                     f"({f.predicted:+.3f}) / {r.score_change:+.3f} | {f.code_change:+.4f} ± {f.code_change_se:.4f} / "
                     f"{r.code_change:+.4f} | {f.rule_variance_left:.2f} ± {f.rule_variance_left_se:.2f} / "
                     f"{r.rule_variance_left:.2f} ± {r.rule_variance_left_se:.2f} | {f.loss_change:+.3f} ± "
                     f"{f.loss_change_se:.3f} / {r.loss_change:+.3f} ± {r.loss_change_se:.3f} | "
                     f"{f.accuracy_change:+.3f} ± {f.accuracy_change_se:.3f} / {r.accuracy_change:+.3f} ± "
                     f"{r.accuracy_change_se:.3f} | {int(f.n)} |")
    return "\n".join(lines) + "\n"


def figures(result: dict, frames: dict) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from qk_analysis.controls import heatmaps

    terms = frames["terms"]
    head = result["head"]

    def panel(label):
        block = terms[terms["panel"] == label]
        rows = list(dict.fromkeys(block["query_component"]))
        columns = list(dict.fromkeys(block["key_component"]))
        return rows, columns, block["value"].to_numpy().reshape(len(rows), len(columns))

    labels = list(dict.fromkeys(terms["panel"]))
    rule_labels = [label for label in labels if label.endswith("(score units)")]
    counts = dict(zip(result["rules_present"], result["p"], strict=True))
    rule_labels = sorted(rule_labels, key=lambda label: -counts[label.split(" minus")[0]])[:4]
    rule_panels = [(f"{label.split(' minus')[0]} (p = {counts[label.split(' minus')[0]]:.2f})", *panel(label))
                   for label in rule_labels]
    share_figure = heatmaps([("share of between-rule variance", *panel(labels[0]))],
                            f"sraven-hyla L{LAYER}.H{head}, context-cell pairs", 1, "share (sums to 1)")
    rule_figure = heatmaps(rule_panels,
                           f"sraven-hyla L{LAYER}.H{head}, context-cell pairs: mean terms of each rule minus "
                           f"the mean over rules ({result['n']} OOD instances)", len(rule_panels),
                           "term difference (score units)")
    patches = frames["patches"]
    frozen = patches[patches["scale"] == "frozen"]
    effects, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
    sides = list(dict.fromkeys(frozen["side"]))
    removals = ["top", "random direction, equal norm", "random component, equal norm"]
    width = 0.8 / len(removals)
    for k, removal in enumerate(removals):
        block = frozen[frozen["removal"].str.startswith(removal)].set_index("side").reindex(sides)
        for axis, what in zip(axes, ("rule_variance_left", "loss_change", "accuracy_change"), strict=True):
            axis.bar(np.arange(len(sides)) + (k - 1) * width, block[what], width, yerr=block[what + "_se"], capsize=2,
                     label="top component" if removal == "top" else removal)
    for axis, label in zip(axes, ("rule-selective variance of the code left", "loss change (nats)",
                                  "accuracy change"), strict=True):
        axis.set_xticks(range(len(sides)), [f"{side} side ({result['tops'][side]})" for side in sides])
        axis.axhline(0, color="black", linewidth=0.6)
        axis.set_ylabel(label, fontsize=8)
    axes[0].axhline(1, color="grey", linewidth=0.6, linestyle="--")
    effects.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    effects.suptitle(f"sraven-hyla L{LAYER}.H{head}: one side path-patched (scale frozen), mean ± s.e. over "
                     f"{result['n_fresh']} OOD instances", fontsize=10)
    return {"sraven_qk_share": share_figure, "sraven_qk_terms": rule_figure, "sraven_patch_effects": effects}
