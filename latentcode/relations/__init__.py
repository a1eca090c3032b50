"""Key-query relations of a pretrained language model: which known operations (sink,
previous token, induction, duplicate, other; `latentcode.analysis.token_relations`) its latent codes
``a[:, q, k]`` select, and whether it uses them.

- `codes`: the codes of every layer at pairs drawn per relation from token sequences
  (`relation_codes` -> `RelationCodes`);
- `induction`: the loss on the second copy of repeated random tokens, its attribution to every
  (layer, head)'s codes at the induction pairs, and the exact ablation of chosen heads there
  beside the same edit at as many random pairs;
- `demo`: the light part of it on SmolLM2-135M (`latentcode demo --task smollm2`).

Decoding and figures are torch-free: `latentcode.analysis.relation_decoding` and
`latentcode.analysis.plots.relations`; `analyses/smollm2_relations.py` writes the results page.
"""

from latentcode.relations.codes import RelationCodes, relation_codes
from latentcode.relations.induction import ablation_effect, induction_attribution, induction_pairs, random_pairs

__all__ = ["RelationCodes", "ablation_effect", "induction_attribution", "induction_pairs", "random_pairs",
           "relation_codes"]
