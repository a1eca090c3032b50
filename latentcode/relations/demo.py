"""`latentcode demo --task smollm2`: the light part of the SmolLM2 relations analysis on
the real model, in a few minutes on 2 cores (most of it loading the model).

On a few sequences of random tokens repeated once: attribution patching of the loss on the second
copy to zeroing every (layer, head)'s code at the induction pairs, then the exact edit for the top
heads one at a time, and for all of them together at the induction pairs beside the same edit at as
many random pairs. Writes ``induction_attribution.png`` and ``induction.json`` into a new
directory and prints the headline. `analyses/smollm2_relations.py` is the full analysis.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from latentcode.files import AtomicOutputs

__all__ = ["DEMO_NAME", "run_smollm2_demo"]

DEMO_NAME = "smollm2"


def run_smollm2_demo(out: str | Path = "latentcode-demo-smollm2", n_sequences: int = 4, half: int = 32,
                     n_top: int = 3, seed: int = 0, progress: bool = True) -> dict:
    """Run the demo (see the module docstring) into a new directory (never an existing one's files);
    returns its numbers."""
    from latentcode.analysis.plots.relations import plot_attribution
    from latentcode.demo import fresh_directory
    from latentcode.pretrained import load_pretrained
    from latentcode.relations.induction import ablation_effect, induction_attribution, induction_pairs, random_pairs
    from latentcode.tasks.token_sequences import repeated_random_tokens

    say = print if progress else (lambda *args, **kwargs: None)
    started = time.perf_counter()
    out = fresh_directory(Path(out))
    out.mkdir(parents=True)
    say(f"latentcode demo: smollm2 -> {out}; loading SmolLM2-135M (dequantising takes a minute or more)")
    pretrained = load_pretrained("smollm2")
    tokenizer = pretrained.tokenizer
    tokens = repeated_random_tokens(n_sequences, half, len(tokenizer), seed, tokenizer.bos_token_id,
                                    low=max(tokenizer.all_special_ids) + 1)
    say(f"  attribution over {pretrained.n_layers} x {pretrained.n_heads} heads, {n_sequences} sequences of "
        f"{half} random tokens repeated once")
    attribution = induction_attribution(pretrained.model, tokens, half, pretrained.n_layers, pretrained.n_heads)
    top = attribution.top(n_top)
    single = {head: ablation_effect(pretrained.model, tokens, half, [head], induction_pairs(half),
                                    attribution.base_loss) for head in top}
    together = ablation_effect(pretrained.model, tokens, half, top, induction_pairs(half), attribution.base_loss)
    control = ablation_effect(pretrained.model, tokens, half, top, random_pairs(half, seed), attribution.base_loss)
    result = {"base_loss": float(attribution.base_loss.mean()), "n_sequences": n_sequences, "half": half,
              "top_heads": [{"layer": layer, "head": head, "attribution": float(attribution.mean()[layer, head]),
                             **single[(layer, head)]} for layer, head in top],
              "top_heads_at_induction_pairs": together, "top_heads_at_random_pairs": control,
              "minutes": (time.perf_counter() - started) / 60}
    plot_attribution(attribution.mean(), {head: (value["effect"], value["effect_se"])
                                          for head, value in single.items()},
                     f"SmolLM2-135M-Instruct: loss on the second copy of {n_sequences} repeated random sequences "
                     f"({half} tokens a copy), demo", out / "induction_attribution")
    with AtomicOutputs(lock=out / "induction", purpose="writing the demo's numbers") as outputs:
        outputs.write_text(out / "induction.json", json.dumps(result, indent=2) + "\n")
    heads = ", ".join(f"{layer}.{head}" for layer, head in top)
    print(f"\nSmolLM2-135M induction heads by attribution (layer.head): {heads}")
    print(f"  loss on the second copy {result['base_loss']:.3f} nats; top {n_top} heads' codes zeroed at the "
          f"induction pairs: {together['effect']:+.3f} ± {together['effect_se']:.3f}; at as many random pairs: "
          f"{control['effect']:+.3f} ± {control['effect_se']:.3f} (n = {n_sequences} sequences)")
    print(f"  {out.resolve()}  ({result['minutes']:.1f} min)")
    return result
