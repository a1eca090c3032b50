"""Why do induction codes take their value? Exact query-key attribution (issue 48) of SmolLM2's induction
heads, checked by path patching. (The issue's second finding, layer 2 of sraven-hyla, is not written yet:
`latentcode qk models/sraven-hyla --layer 2 --head H --pairs '35:*'` gives one instance's terms.)

SmolLM2-135M. Each sequence is a validation window of --half tokens repeated once, so every token of the
second half has an induction pair (its key: the token after its first occurrence). For each head of
--heads (the induction heads of the results page, 18.6, 18.7, 17.3) and a control head drawn at random
(seeded) from the same layers:

- the key-side marginals at induction pairs and at as many non-induction pairs of the second half
  (random, causal), means and standard errors over sequences;
- the previous-token score of every head before the layer (its mean softmax attention from q to q - 1 on
  the same sequences, from the model's own q_proj/k_proj outputs and RoPE) beside the head's top key-side
  components: is the component that carries the induction score a previous-token head?
- causal: the top key-side component removed from the key side of that head only (path patching, scale
  frozen and recomputed): the change of the induction codes (mean over induction pairs) and of the loss
  on the second half, beside removing a component drawn at random among the other heads of the
  component's own layer.

Writes `qk_findings.csv`, `qk_findings.md` and, per head, the `qk` table and figure of the first sequence's
induction pairs (`L{l}.H{h}/qk.csv`, `qk.png`).

    python analyses/qk_findings.py --n 8 --half 64 --out analyses/output/qk_findings

Run once at the end of issue 48's session (--n 4 --half 64, 78 s on one core): its numbers are not on the
results page yet, the outputs of that run are in analyses/results/qk_findings/ (summary, and the table and figure of 18.6).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from latentcode.files import AtomicOutputs
from latentcode.intervention.qk import decompose, path_patch, qk_attribution, read_head
from latentcode.pretrained import corpus_token_windows, load_pretrained


def previous_token_scores(model, tokens: torch.Tensor) -> np.ndarray:
    """`[layer, head]` mean attention from q to q - 1 (q >= 1), from q_proj/k_proj outputs and RoPE."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    captured: dict = {}
    layers = model.model.layers
    handles = [model.model.rotary_emb.register_forward_hook(lambda m, i, o: captured.update(cos=o[0], sin=o[1]))]
    for index, layer in enumerate(layers):
        handles.append(layer.self_attn.q_proj.register_forward_hook(lambda m, i, o, index=index: captured.update({f"q{index}": o})))
        handles.append(layer.self_attn.k_proj.register_forward_hook(lambda m, i, o, index=index: captured.update({f"k{index}": o})))
    with torch.no_grad():
        model(tokens)
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
        scores.append(pattern[0, :, torch.arange(1, n), torch.arange(0, n - 1)].mean(-1).numpy())
    return np.stack(scores)


def second_half_loss(tokens: torch.Tensor, half: int):
    targets = tokens[0, half + 1:]
    return lambda logits: F.cross_entropy(getattr(logits, "logits", logits)[0, half:-1].float(), targets)


def smollm2(args) -> tuple[pd.DataFrame, list]:
    pretrained = load_pretrained("smollm2")
    model = pretrained.model
    heads = [tuple(int(x) for x in spec.split(".")) for spec in args.heads]
    rng = random.Random(args.seed)
    others = [(layer, head) for layer in sorted({layer for layer, _ in heads}) for head in range(pretrained.n_heads)
              if (layer, head) not in heads]
    control = rng.choice(others)  # a head of the same layers that is none of the induction heads
    windows = corpus_token_windows(pretrained, "validation", args.half, args.n, seed=args.seed)
    rows, first_tokens, first_induction = [], None, None
    for sequence_index, window in enumerate(windows):
        tokens = torch.as_tensor(np.concatenate([window, window]))[None]
        first_tokens = first_tokens if first_tokens is not None else tokens
        previous = previous_token_scores(model, tokens)
        n = tokens.shape[1]
        induction = torch.tensor([(q, k) for q in range(args.half, n) for k in range(1, args.half + 1)
                                  if tokens[0, k - 1] == tokens[0, q] and k - 1 == q - args.half])
        generator = torch.Generator().manual_seed(args.seed + sequence_index)
        queries = torch.randint(args.half, n, (len(induction),), generator=generator)
        keys = (torch.rand(len(induction), generator=generator) * (queries + 1)).long()
        first_induction = first_induction if first_induction is not None else induction
        other = torch.stack([queries, keys], 1)
        other = other[(other[:, 1] != other[:, 0] - args.half + 1)]
        for layer, head in [*heads, control]:
            reading, _ = read_head(model, tokens, layer, head)
            for kind, pairs in (("induction", induction), ("non-induction", other)):
                terms = decompose(reading, pairs)
                key_side = terms.key_marginal.double().mean(0)
                for index, name in enumerate(terms.names):
                    source_layer, source_head = parse_head(name)
                    rows.append(dict(model="smollm2", head=f"{layer}.{head}", control=(layer, head) == control,
                                     pairs=kind, sequence=sequence_index, component=name, side="key",
                                     marginal=float(key_side[index]), score=float(terms.scores.double().mean()),
                                     previous_token_score=(float(previous[source_layer, source_head])
                                                           if source_layer is not None else np.nan)))
                if kind != "induction":
                    continue
                top = terms.names[int(key_side.abs().argmax())]
                top_layer, _ = parse_head(top)
                candidates = [name for name in terms.names if name != top and parse_head(name)[0] == top_layer]
                drawn = random.Random(args.seed + sequence_index).choice(candidates) if candidates else None
                for label, component in (("top key-side component", top), ("random component", drawn)):
                    if component is None:
                        continue
                    patch = path_patch(model, tokens, reading, terms, component, "key", second_half_loss(tokens, args.half))
                    for scale in ("frozen", "recomputed"):
                        rows.append(dict(model="smollm2", head=f"{layer}.{head}", control=(layer, head) == control,
                                         pairs="induction", sequence=sequence_index, component=component,
                                         side=f"path patch: {label} ({scale} scale)",
                                         marginal=float(patch.score_change[scale].double().mean()),
                                         code_change=float(patch.code_change[scale].double().mean()),
                                         loss_change=patch.loss_change[scale],
                                         predicted=float(patch.predicted.double().mean())))
    return pd.DataFrame(rows), [heads, control, first_tokens, first_induction]


def parse_head(name: str) -> tuple[int | None, int | None]:
    if name.startswith("L") and ".H" in name:
        layer, head = name[1:].split(".H")
        return int(layer), int(head)
    return None, None


def summary(table: pd.DataFrame) -> str:
    lines = ["# Query-key attribution of SmolLM2's induction heads (issue 48)", ""]
    marginals = table[table["side"] == "key"]
    grouped = marginals.groupby(["head", "pairs", "component"])["marginal"]
    stats = pd.DataFrame({"mean": grouped.mean(), "se": grouped.sem(), "n": grouped.count()}).reset_index()
    previous = marginals.groupby("component")["previous_token_score"].mean()
    for (head, pairs), block in stats.groupby(["head", "pairs"]):
        block = block.reindex(block["mean"].abs().sort_values(ascending=False).index).head(5)
        parts = [f"{row.component} {row.mean:+.3f} ± {row.se:.3f} (prev-token {previous[row.component]:.2f})"
                 for row in block.itertuples()]
        lines.append(f"- {head}, {pairs} pairs: top key-side components: " + "; ".join(parts))
    lines.append("")
    patches = table[table["side"].str.startswith("path patch")]
    if len(patches):
        grouped = patches.groupby(["head", "side"])
        for (head, side), block in grouped:
            lines.append(f"- {head}, {side}: score {block['marginal'].mean():+.3f} ± {block['marginal'].sem():.3f} "
                         f"(predicted {block['predicted'].mean():+.3f}), induction code "
                         f"{block['code_change'].mean():+.4f} ± {block['code_change'].sem():.4f}, loss on the second "
                         f"half {block['loss_change'].mean():+.4f} ± {block['loss_change'].sem():.4f} nats "
                         f"(n={len(block)} sequences)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="sequences (default 8)")
    parser.add_argument("--half", type=int, default=64, help="tokens per half of a repeated window (default 64)")
    parser.add_argument("--heads", nargs="+", default=["18.6", "18.7", "17.3"], help="induction heads, LAYER.HEAD")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="analyses/output/qk_findings")
    parser.add_argument("--quiet", action="store_true", help="print no summary")
    args = parser.parse_args()
    table, (heads, control, first_tokens, first_induction) = smollm2(args)
    out = Path(args.out)
    if not args.quiet:
        print(summary(table))
    with AtomicOutputs(lock=out / "qk_findings", purpose="analyses/qk_findings.py") as outputs:
        outputs.write_text(out / "qk_findings.csv", table.to_csv(index=False))
        outputs.write_text(out / "qk_findings.md", summary(table))
    pretrained = load_pretrained("smollm2")
    for layer, head in [*heads, control]:
        qk_attribution(pretrained.model, first_tokens, layer, head, first_induction.numpy(), top=10,
                       out=out / f"L{layer}.H{head}", overwrite=True, name="SmolLM2-135M",
                       title=f"SmolLM2-135M: layer {layer}, head {head}; induction pairs of a repeated window "
                             f"(n={len(first_induction)})")


if __name__ == "__main__":
    main()
