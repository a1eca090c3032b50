"""`TokenWindows`: what a pretrained causal LM reads, as a task like the others.

    windows = subject.task({"seq_len": 64})          # LanguageModelSubject.task -> token_windows(...)
    windows.check_split(None)                        # "validation" (the held-out split), or one line
    ids = windows.draw(loaded, "validation", n=32, seed=0)   # int64 [32, 64 + 1]: inputs and next token
    window_metrics(logits[:, p0:], ids[:, 1 + p0:])          # [32, 3]: METRICS per window
    windows.donors(32, seed=0)                       # [32]: the donor window of each (resample ablation)

Instances are windows of the language corpus's `split` tokenised by the model's own tokenizer
(`pretrained.corpus_token_windows`); the metric is next-token prediction (`window_metrics`); a text has no
counterfactual pairs, so its donors are other windows (`donors`). Torch-free until `draw`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from latentcode.errors import UsageError, about
from latentcode.tasks.corpus import SPLITS
from latentcode.validation import check_integer

DEFAULT_SEQ_LEN = 512  # tokens per window, unless the task says (extract, intervene and patch alike)
MAX_TOKENS_PER_PASS = 2048  # windows x tokens of one forward pass (intervene, patch): logits of 2048 x vocabulary
# Tokens a whole patch of windows may run through the model (window passes x seq_len), refused up front as
# groups beyond --max-groups are: 2^28 tokens are about 7 hours of SmolLM2-135M at 10^4 tokens a second.
MAX_PATCH_TOKENS = 2**28
LOGIT_BYTES_PER_TOKEN = 3 * 4 * 65_536  # logits, their log-softmax and a copy, float32, a vocabulary up to 64k
METRICS = ("next-token loss", "next-token probability", "next-token accuracy")
# The labels of a window, by its last token's text: its class, and whether it starts a word (a binary
# label small files can probe).
TOKEN_CLASSES = ("word start", "word piece", "punctuation", "digit", "whitespace")
LABEL_VALUES = {"last_token_class": list(TOKEN_CLASSES), "last_token_starts_word": ["no", "yes"]}


@dataclass(frozen=True)
class TokenWindows:
    """Windows of `seq_len` tokens of the corpus, read by the causal LM `model_name` (context `n_ctx`)."""

    model_name: str
    seq_len: int
    n_ctx: int | None = None

    name = "language"
    splits = SPLITS
    held_out_split = "validation"
    metric_names = METRICS

    @property
    def variant(self) -> str:
        """What a table's `variant` column says of these windows."""
        return f"T={self.seq_len}"

    @property
    def n_predictions(self) -> int:
        """Every position predicts the next token."""
        return self.seq_len

    def position_partitions(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Partitions of a window's positions (a text has no task structure, only position), as a task's
        (`tasks.partitions.task_partitions`): the first token (where many heads park their attention) vs
        the rest, and four contiguous quarters."""
        edges = [round(self.seq_len * part / 4) for part in range(5)]
        quarters = {f"quarter {part}": tuple(range(edges[part], edges[part + 1])) for part in range(4)}
        return {"first": {"first token": (0,), "later tokens": tuple(range(1, self.seq_len))},
                "quarter": {name: positions for name, positions in quarters.items() if positions}}

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "seq_len": self.seq_len}

    def check_split(self, split: str | None) -> str:
        """`split` (None: validation) if the corpus has it, else the one line naming what it has."""
        split = self.held_out_split if split is None else split
        if split not in SPLITS:
            with about("split"):
                raise UsageError(f"unknown split {split!r} for a pretrained model: it reads the language corpus's "
                                 f"{' or '.join(SPLITS)} split")
        return split

    def draw(self, loaded: Any, split: str, n: int, seed: int, extra: int = 1) -> np.ndarray:
        """int64 `[n, seq_len + extra]`: `n` windows of `split` (seed `seed`) tokenised by `loaded`'s
        tokenizer (`extra` tokens beyond the window: the last position's target)."""
        from latentcode.pretrained import corpus_token_windows

        return corpus_token_windows(loaded.pretrained, split, self.seq_len, n, seed, extra=extra)

    @staticmethod
    def labels(tokenizer: Any, ids: np.ndarray) -> dict[str, np.ndarray]:
        """LABEL_VALUES of windows `ids` `[n, T]`: int64 `[n]` each, from the text of their last token."""
        classes = np.asarray([token_class(tokenizer.decode([int(token)])) for token in ids[:, -1]], dtype=np.int64)
        return {"last_token_class": classes, "last_token_starts_word": (classes == 0).astype(np.int64)}

    @staticmethod
    def donors(n: int, seed: int) -> np.ndarray:
        """`[n]` int: the donor window of each base window, a derangement (one random cycle through all
        n windows, seed `seed`), so no window is its own donor (n >= 2)."""
        order = np.random.default_rng(seed).permutation(n)
        donor = np.empty(n, dtype=np.int64)
        donor[order] = np.roll(order, -1)
        return donor


def token_class(text: str) -> int:
    """The class (an index into TOKEN_CLASSES) of a token's text."""
    stripped = text.strip()
    if not stripped:
        return 4
    if stripped[0].isdigit():
        return 3
    if stripped[0].isalpha():
        return 0 if text[0].isspace() else 1
    return 2


def token_windows(subject: Any, task: Mapping[str, Any] | None, default_seq_len: int | None = None) -> TokenWindows:
    """The windows `subject` (a causal LM) reads for `task` (None, or {"seq_len": T}: a mapping with nothing
    else but the language task's name), the length checked against its context; one line naming what was wrong."""
    seq_len = DEFAULT_SEQ_LEN if default_seq_len is None else default_seq_len
    with about("task"):
        if task is not None:
            if (not isinstance(task, Mapping) or set(task) - {"seq_len", "name"}
                    or task.get("name", "language") != "language"):
                raise UsageError(f"a pretrained model reads windows of the language corpus: the task may give only "
                                 f"seq_len (e.g. {{'seq_len': 2048}}, --task seq_len=2048), got {task!r}")
            seq_len = check_integer("seq_len", task.get("seq_len", seq_len), minimum=1)  # "long", 64.5: refused
        if subject.n_ctx and seq_len > subject.n_ctx:
            raise UsageError(f"seq_len={seq_len} is beyond the context of {subject.name} ({subject.n_ctx} positions); "
                             f"expected <= {subject.n_ctx}")
    return TokenWindows(subject.name, seq_len, subject.n_ctx)


def window_metrics(logits: Any, targets: Any) -> Any:
    """logits `[batch, P, vocabulary]`, targets int64 `[batch, P]` -> `[batch, 3]`: METRICS per window
    (computed in float32 whatever the logits' dtype, on their device):

        loss        = mean_p -log softmax(logits[p])[target[p]]
        probability = mean_p  softmax(logits[p])[target[p]]
        accuracy    = mean_p  [argmax logits[p] == target[p]]
    """
    import torch

    log_probabilities = torch.log_softmax(logits.float(), dim=-1)
    loss = -log_probabilities.gather(-1, targets[..., None])[..., 0]
    accuracy = (logits.argmax(-1) == targets).float()
    return torch.stack([loss.mean(1), torch.exp(-loss).mean(1), accuracy.mean(1)], dim=1)
