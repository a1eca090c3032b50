"""Site groups shaped by the task and the search that needs no answer (issue 31).

- Every task's partitions cut its positions into parts, each position once; SRAVEN's slot j is
  position j of every panel (the queried feature's cells are slot M-1).
- A partition grid is every query part x key part, and a group patches exactly those pairs.
- A toy model whose answer is read only from the codes of a strided block (queries and keys 2, 5, 8
  of layer 1) hides nothing else: the search, told nothing of the block, ends inside it, and the
  fresh-pair transfer of what it found is as large as the block's own.
"""

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from latentcode.intervention.patching import (
    part_group,
    partition_grid,
    site_search,
    task_partitions,
)
from latentcode.models.hooks import HookedRootModule, HookPoint
from latentcode.sources.site_pairs import SitePairs
from latentcode.tasks import get_task

SEQ_LEN, N_RULES = 12, 3
BLOCK = (2, 5, 8)  # queries and keys of the planted block: every 3rd position from 2


@pytest.mark.parametrize("config", [dict(name="sraven"), dict(name="fuzzy_logic", seq_len=10),
                                    dict(name="language", seq_len=40)])
def test_every_partition_cuts_the_positions_into_parts_once(config):
    task = get_task(**config)
    partitions = task_partitions(task)
    assert "context" in partitions and len(partitions) >= 3
    for name, parts in partitions.items():
        positions = sorted(p for part in parts.values() for p in part)
        assert positions == list(range(task.seq_len)), name


def test_sraven_slots_are_one_position_of_every_panel():
    task = get_task("sraven")  # M = 4 features, 9 panels of 4 tokens
    partitions = task_partitions(task)
    assert partitions["slot"]["slot 3"] == (3, 7, 11, 15, 19, 23, 27, 31, 35)
    assert partitions["context"]["query"] == (32, 33, 34, 35)
    assert partitions["row"]["row 2"] == tuple(range(24, 36))
    assert partitions["column"]["column 0"] == (0, 1, 2, 3, 12, 13, 14, 15, 24, 25, 26, 27)


def test_a_partition_grid_patches_each_query_part_x_key_part():
    task = get_task("sraven")
    partitions = task_partitions(task)
    groups = partition_grid(partitions, "slot", "context", layers=[2])
    assert len(groups) == 4 * 2
    group = next(g for g in groups if g.coordinates["query_part"] == "slot 3" and g.coordinates["key_part"] == "context")
    queries, keys = SitePairs(group.selector, 4, "latentcode")(2, 36)
    expected = {(q, k) for q in partitions["slot"]["slot 3"] for k in range(32)}
    assert set(zip(queries.tolist(), keys.tolist(), strict=True)) == expected
    assert SitePairs(group.selector, 4, "latentcode")(1, 36) is None  # layer 2 only
    per_head = partition_grid(partitions, "slot", layers=[0, 1], n_heads=3)
    assert len(per_head) == 2 * 4 * 4 * 3 and per_head[0].heads == (0,)


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.hook_pattern = HookPoint()


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attention()


class PlantedBlock(HookedRootModule):
    """Two attention layers of one head. In each, a query carrying rule r (one-hot in its first
    N_RULES features) attends sharply to the key that carries index r (one-hot in the next N_RULES),
    i.e. to position BLOCK[r]; the answer (logits at the last position) is the sum over BLOCK's
    queries of layer 1's attention-weighted key indices. So only layer 1's codes from BLOCK to BLOCK
    carry the rule to the answer; layer 0's codes reach nothing."""

    def __init__(self, sharpness: float = 20.0):
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.sharpness = sharpness
        self.setup()

    def forward(self, x):
        rule, index = x[..., :N_RULES], x[..., N_RULES:]
        scores = self.sharpness * torch.einsum("bqr,bkr->bqk", rule, index)[:, None]
        pattern = None
        for block in self.blocks:
            pattern = block.attn.hook_pattern(torch.softmax(scores, dim=-1))  # [batch, head, query, key]
        mixed = torch.einsum("bhqk,bkr->bqr", pattern, index)
        return mixed[:, list(BLOCK)].sum(1)[:, None]  # [batch, 1 prediction, N_RULES]


@dataclass
class ToyPairs:
    """What transfer_sweep reads of `CounterfactualPairs`."""

    base: "ToyBatch"
    donors: dict
    base_answer: np.ndarray
    counterfactual_answer: np.ndarray
    prediction: int = 0

    def __len__(self):
        return len(self.base_answer)


@dataclass
class ToyBatch:
    x: torch.Tensor

    def torch(self):
        return self


class ToyTask:
    name, seq_len, n_predictions, objective = "planted", SEQ_LEN, 1, "classification"

    def position_partitions(self):
        return {"stride": {f"stride {j}": tuple(range(j, SEQ_LEN, 3)) for j in range(3)},
                "half": {"first half": tuple(range(SEQ_LEN // 2)), "second half": tuple(range(SEQ_LEN // 2, SEQ_LEN))}}


def _inputs(rules: np.ndarray) -> torch.Tensor:
    x = torch.zeros(len(rules), SEQ_LEN, 2 * N_RULES)
    for index, position in enumerate(BLOCK):
        x[:, position, N_RULES + index] = 1.0
        x[torch.arange(len(rules)), position, torch.as_tensor(rules)] = 1.0
    return x


def _pairs(n: int, seed: int) -> ToyPairs:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, N_RULES, n)
    different = (base + 1 + rng.integers(0, 2, n)) % N_RULES
    third = 3 - base - different  # the rule that is neither
    donors = {"different": ToyBatch(_inputs(different)), "third": ToyBatch(_inputs(third)),
              "same": ToyBatch(_inputs(base))}
    return ToyPairs(ToyBatch(_inputs(base)), donors, base, different)


def test_the_toy_model_answers_the_rule_of_its_block():
    pairs = _pairs(32, seed=0)
    with torch.no_grad():
        answer = PlantedBlock().eval()(pairs.base.x)[:, 0].argmax(-1).numpy()
    assert (answer == pairs.base_answer).all()


def test_the_search_finds_a_planted_strided_block_without_being_told():
    model, task = PlantedBlock().eval(), ToyTask()
    result = site_search(model, task, _pairs(64, seed=0), _pairs(64, seed=1))
    queries, keys = SitePairs(result.found.selector, 2, "latentcode")(1, SEQ_LEN)
    found = set(zip(queries.tolist(), keys.tolist(), strict=True))
    assert found and found <= {(q, k) for q in BLOCK for k in BLOCK}  # inside the planted block, at layer 1
    assert SitePairs(result.found.selector, 2, "latentcode")(0, SEQ_LEN) is None
    route = result.confirmed
    assert route["step"].iloc[0] == "layer: layer 1"  # the whole layer that holds the block ranks first
    assert route["transfer"].iloc[-1] >= 0.9  # what it found transfers on fresh pairs ...
    from latentcode.intervention.transfer import transfer_sweep

    planted = transfer_sweep(model, task, _pairs(64, seed=1), [part_group(1, BLOCK, BLOCK)],
                             relations=("different", "third", "same"))
    assert route["transfer"].iloc[-1] >= planted["transfer"].iloc[0] - 2 * planted["transfer se"].iloc[0]  # ... as the block
    import pandas as pd

    both = pd.concat([route, planted], ignore_index=True)  # two sweeps on different pairs (pandas compares attrs)
    assert len(both) == len(route) + 1 and "per_example" not in both.attrs
    assert route["damage"].iloc[-1] == pytest.approx(0.0, abs=1e-9)  # a same-rule donor changes nothing here
    layer_0 = result.candidates[(result.candidates["stage"] == "layer") & (result.candidates["layer"] == 0)]
    assert layer_0["transfer"].iloc[0] == pytest.approx(0.0, abs=1e-9)
