"""Issue 48's findings on the results page: the section `analyses/qk_findings.py` recorded in
results/qk_findings/ (`qk_findings.md`, its tables and figures), with its links made relative to the page."""

from __future__ import annotations

from pathlib import Path

QK_FINDINGS = Path(__file__).resolve().parents[1] / "results" / "qk_findings"


def qk_section() -> str:
    """The recorded findings, or how to make them."""
    recorded = QK_FINDINGS / "qk_findings.md"
    if not recorded.is_file():
        return ("Not measured yet: `nice -n 15 python analyses/qk_findings.py`, then "
                "`python analyses/reproduce.py page`.")
    body = recorded.read_text()
    summary_line, _, rest = body.partition("\n\n")
    body = f"{summary_line}\n\nWhat the tables below say:\n\n{reading()}\n\n{rest}"
    for picture in sorted(QK_FINDINGS.glob("*.png")):
        body = body.replace(f"]({picture.name})", f"](results/qk_findings/{picture.name})")
    return body.strip()


def reading() -> str:
    """What the recorded tables say, in two sentences per model, computed from them (nothing typed in)."""
    import json

    import pandas as pd

    summary = json.loads((QK_FINDINGS / "summary.json").read_text())
    lines = []
    if "smollm2" in summary:
        marginals = pd.read_csv(QK_FINDINGS / "smollm2_marginals.csv", dtype={"head": str})
        patches = pd.read_csv(QK_FINDINGS / "smollm2_patches.csv", dtype={"head": str})
        previous = pd.read_csv(QK_FINDINGS / "smollm2_previous_token.csv")
        heads, control = summary["smollm2"]["heads"], summary["smollm2"]["control"]

        def top(head, pairs):
            block = marginals[(marginals["head"] == head) & (marginals["pairs"] == pairs)]
            return block.loc[block["key_marginal"].abs().idxmax()]

        tops = {head: top(head, "induction") for head in heads}
        names = sorted({row.component for row in tops.values()})
        same = marginals[(marginals["pairs"] == "non-induction") & marginals["head"].isin(heads)
                         & marginals["component"].isin(names)]
        earlier = previous[previous["layer"] < min(int(h.split(".")[0]) for h in [*heads, control])]
        rank = earlier["previous_token_score"].rank(ascending=False)
        ranks = [int(rank[(earlier["layer"] == int(n[1:].split(".H")[0])) & (earlier["head"] == int(n.split(".H")[1]))]
                     .iloc[0]) for n in names if ".H" in n]
        frozen = patches[patches["scale"] == "frozen"]
        removed = frozen[frozen["removal"] == "top key-side component"].set_index("head").loc[heads]
        controls = frozen[frozen["removal"] != "top key-side component"].set_index("head").loc[heads]
        control_top = top(control, "induction")
        lines.append(
            "- **SmolLM2**: at induction pairs the largest key-side component of each induction head "
            f"({', '.join(heads)}) is {', '.join(names)} (key marginal "
            f"{min(r.key_marginal for r in tops.values()):.1f} to {max(r.key_marginal for r in tops.values()):.1f} "
            f"score units; at non-induction pairs {same['key_marginal'].min():.1f} to "
            f"{same['key_marginal'].max():.1f}), "
            f"""{'a previous-token head: rank ' + ', '.join(map(str, ranks)) + ' of ' + str(len(earlier))
                 if ranks else 'not a head'}"""
            " heads before it by previous-token score "
            f"""({', '.join(sorted({f'{r.previous_token_score:.2f}' for r in tops.values()
                                    if r.previous_token_score == r.previous_token_score}))}"""
            f"; median {earlier['previous_token_score'].median():.2f}). The random head {control}'s largest is "
            f"{control_top.component} ({control_top.key_marginal:+.2f}). Path-patching that component out of each "
            f"head's key side lowers the induction code by {-removed['code_change'].max():.2f} to "
            f"{-removed['code_change'].min():.2f} and raises the loss on the repeated tokens by "
            f"{removed['loss_change'].min():.2f} to {removed['loss_change'].max():.2f} nats; the equal-norm controls "
            f"move the code by at most {controls['code_change'].abs().max():.3f} and the loss by at most "
            f"{controls['loss_change'].abs().max():.3f} nats.")
    if "sraven" in summary:
        components = pd.read_csv(QK_FINDINGS / "sraven_components.csv")
        patches = pd.read_csv(QK_FINDINGS / "sraven_patches.csv")
        frozen = patches[patches["scale"] == "frozen"]
        tops = frozen[frozen["removal"].str.startswith("top")].set_index("side")
        controls = frozen[~frozen["removal"].str.startswith("top")]
        shares = {side: components.loc[components[f"{side}_share"].abs().idxmax()] for side in ("query", "key")}
        lines.append(
            f"- **sraven-hyla**: the rule-selective part of head {summary['sraven']['head']}'s score is spread over "
            f"many components: the largest query-side share is {shares['query'].component} "
            f"{shares['query'].query_share:.2f}, the largest key-side {shares['key'].component} "
            f"{shares['key'].key_share:.2f}. Removing either from its side leaves "
            f"{tops.loc['query', 'rule_variance_left']:.2f} / {tops.loc['key', 'rule_variance_left']:.2f} of the "
            f"rule-selective variance of the code (equal-norm controls {controls['rule_variance_left'].min():.2f} to "
            f"{controls['rule_variance_left'].max():.2f}) but changes the answer's loss by at most "
            f"{frozen['loss_change'].abs().max():.4f} nats and its accuracy by at most "
            f"{frozen['accuracy_change'].abs().max():.3f}: "
            "removing one component from one head leaves the answer as it was.")
    return "\n".join(lines)
