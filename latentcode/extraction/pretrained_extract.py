"""`extract_pretrained`: latent codes of a pretrained causal LM (`latentcode.pretrained`) on windows of
the language corpus, with every pair of every layer in a compact store (`latentcode.store.compact`).

    extract_pretrained("smollm2", split="validation", n=2, seq_len=2048, out="smollm2.h5")
    CodeFile("smollm2.h5").compact.rows(layer=10, queries=[-1])      # [N, H, 1, T], rebuilt

The file is a codes file like any other: the selector's sites (default `*:-1:-1`, the last token to
itself in every layer) are stored as `[N, H]` codes beside the labels, so probes, plots, heatmaps
and the report read it unchanged; `/compact` holds the post-RoPE queries and keys of every layer,
from which `CodeFile.codes` rebuilds any other pair. Each layer's queries and keys go to disk as the
layer's attention call returns, so memory holds one layer of them, never `[H, T, T]`.

Sharded like a trained model's extraction (`latentcode.extraction.pipeline`): launched as several
processes, every process draws the same windows and records a contiguous share of the batches, compact
store included, into `OUT.shard-RANK-of-WORLD.h5`; rank 0 then writes `out` as virtual datasets over
the shards (`/compact` too), which `CodeFile` reads as the one-process file. Every process loads the
model (a GGUF's cache entry is filled by one of them; `latentcode.pretrained_cache`).

    torchrun --standalone --nproc_per_node 2 -m latentcode.cli -- extract smollm2 --task seq_len=2048 --n 4

Labels, per window: `last_token_class`, the class of the last token's text (`TOKEN_CLASSES`), and
`last_token_starts_word` (1 where that class is "word start"), a binary label small files can probe.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from latentcode.extraction.pipeline import check_sharded_output, record_in_shards
from latentcode.extraction.recorder import Recorder
from latentcode.sources.compact_capture import CompactAttentionSource, CompactError, CompactLayer
from latentcode.sources.sites import MAX_ALL_PAIRS, SiteError, parse_selector
from latentcode.store import CodeWriter, InMemoryCodes
from latentcode.store.compact import COMPACT_VERSION, KEY_VALID, key_name, query_name
from latentcode.validation import check_integer

TOKEN_CLASSES = ("word start", "word piece", "punctuation", "digit", "whitespace")


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


def check_every_layer_read(pretrained: Any, layers_read: set[int]) -> None:
    """One line where a forward pass made fewer attention calls than the model has layers: a model whose
    attention goes neither through scaled_dot_product_attention nor transformers' eager attention
    registry, whose missing layers would otherwise leave the compact store without them."""
    if len(layers_read) != pretrained.n_layers:
        config = pretrained.model.config
        raise CompactError(
            f"{pretrained.name} ({getattr(config, 'model_type', '?')}, {config._attn_implementation} attention): "
            f"{len(layers_read)} of its {pretrained.n_layers} layers made an attention call latentcode reads "
            "(scaled_dot_product_attention, or transformers' eager attention through its registry); the others "
            "compute attention in a way that is not read exactly, so no codes are recorded")


def extract_pretrained(
    model: Any,
    split: str = "validation",
    n: int = 1,
    seq_len: int = 512,
    out: str | Path | InMemoryCodes | None = None,
    *,
    selector: str = "*:-1:-1",
    batch_size: int = 1,
    seed: int = 0,
    compact: bool = True,
    score: str = "pattern",
    append: bool = False,
    overwrite: bool = False,
    compression: str | None = "none",
    progress: bool = True,
    wait_for_lock: float | None = 0.0,
    device: str | None = None,
    dtype: str | None = None,
) -> Path | InMemoryCodes:
    """Record codes of `n` windows of `seq_len` tokens of the corpus's `split` into `out`.

    model: a `Pretrained`, or what `load_pretrained` takes (a directory, a .gguf file, "smollm2").
    compact: keep every pair of every layer in /compact (queries and keys); False: the sites only.
    device, dtype: where and in what a model loaded here runs (`load_pretrained`); codes are float32.
    compression: of a new file; "none" by default (queries and keys barely compress, and reading a
    row back is faster without)."""
    from latentcode.pretrained import (
        Pretrained,
        check_seq_len,
        checkpoint_sha256,
        corpus_token_windows,
        load_pretrained,
    )

    n, batch_size = check_integer("n", n, minimum=1), check_integer("batch_size", batch_size, minimum=1)
    check_sharded_output(out, append, overwrite)  # before the model loads: refused in every process alike
    pretrained = model if isinstance(model, Pretrained) else load_pretrained(model, device=device, dtype=dtype,
                                                                                  progress=progress)
    check_seq_len(seq_len, pretrained.n_ctx, pretrained.name)
    implementation = getattr(pretrained.model.config, "_attn_implementation", "sdpa")
    if implementation not in ("sdpa", "eager"):  # load_pretrained loads one of these; a Pretrained built by hand
        raise CompactError(f"{pretrained.name} runs with {implementation!r} attention; latentcode reads "
                           "scaled_dot_product_attention and transformers' eager attention exactly: load it with "
                           "attn_implementation='sdpa' or 'eager'")
    parsed = parse_selector(selector)
    sites = parsed.resolve(pretrained.n_layers, seq_len)
    if len(sites) > MAX_ALL_PAIRS:
        raise SiteError(f"{selector!r} selects {len(sites)} sites; a codes file holds at most {MAX_ALL_PAIRS} as "
                        "datasets: select fewer; the compact store rebuilds any other pair on demand")
    ids = corpus_token_windows(pretrained, split, seq_len, n, seed)
    names = [pretrained.tokenizer.decode([int(token)]) for token in ids[:, -1]]
    classes = np.asarray([token_class(name) for name in names], dtype=np.int64)
    labels = {"last_token_class": classes, "last_token_starts_word": (classes == 0).astype(np.int64)}
    info = {"version": COMPACT_VERSION, "layers": list(range(pretrained.n_layers)), "n_heads": pretrained.n_heads,
            "n_kv_heads": pretrained.n_kv_heads, "head_dim": pretrained.head_dim, "seq_len": seq_len}
    config = pretrained.model.config.to_dict()
    metadata = {
        "model_name": pretrained.name,
        # Not where this process loaded it from (`_name_or_path`: the GGUF's directory, or its cache entry
        # once cached; `model_path` says where the model is): ranks of one launch, and appends, agree.
        "model_config": {key: value for key, value in config.items()
                         if key not in ("quantization_config", "_name_or_path")},
        "checkpoint_sha256": checkpoint_sha256(pretrained.path),
        "model_path": str(pretrained.path.resolve()),
        "model_dtype": str(pretrained.dtype).removeprefix("torch."),
        "task_config": {},
        "selector": {"spec": selector, "sites": [[s.layer, s.query, s.key] for s in sites]},
        "score": score,
        "source": "torch",
        "seed": seed,
        "value_names": {"last_token_class": list(TOKEN_CLASSES), "last_token_starts_word": ["no", "yes"]},
        "split_descriptions": {split: f"windows of {seq_len} tokens of the language corpus's {split} split"},
        "compact": info if compact else {},
        # The text of every token id, so that the file names its tokens (the token view, keys named by
        # their text) without the tokenizer: about 0.5 MB for SmolLM2's 49,152 tokens, 2 s to decode.
        "token_names": [pretrained.tokenizer.decode([token]) for token in range(len(pretrained.tokenizer))],
    }
    # Only the attention calls are read: the LM head's logits for the last position alone (at T = 8,192
    # every position's logits are 1.5 GiB, the bare forward's whole peak). Causal LMs of transformers take
    # `logits_to_keep`; a model that does not computes them all.
    logits = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(pretrained.model.forward).parameters else {}

    def record(path: Path | bytes | None, batches: range, append: bool, progress: bool) -> bytes | None:
        """Windows `batches.start * batch_size` up to `batches.stop * batch_size` (at most n) into `path`."""
        writer = CodeWriter(path, sites, pretrained.n_heads, metadata, append=append, overwrite=overwrite,
                            compression=compression, wait_for_lock=wait_for_lock)
        first, stop = batches.start * batch_size, min(n, batches.stop * batch_size)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=(stop - first) * pretrained.n_layers, desc=f"extract {pretrained.name} T={seq_len}",
                       unit="layer")

        def on_layer(layer: int, call: CompactLayer) -> None:
            layers_read.add(layer)
            if compact:
                if call.query.shape[1:] != (info["n_heads"], seq_len, info["head_dim"]) or \
                        call.key.shape[1] != info["n_kv_heads"]:
                    raise CompactError(f"attention call {layer}: queries {list(call.query.shape)}, keys "
                                       f"{list(call.key.shape)}; expected {info['n_heads']} query and "
                                       f"{info['n_kv_heads']} key/value heads of {info['head_dim']} over {seq_len}")
                writer.write_compact(query_name(layer), call.query, call.mask.attributes())
                writer.write_compact(key_name(layer), call.key)
                if layer == 0:
                    writer.write_compact(KEY_VALID, call.key_valid)
            if bar is not None:
                bar.update(len(call.query))

        layers_read: set[int] = set()
        source = CompactAttentionSource(pretrained.model, on_layer)
        try:
            with Recorder(pretrained.model, sites, score=score, source=source) as recorder, torch.no_grad():
                for start in range(first, stop, batch_size):
                    batch = torch.from_numpy(ids[start : start + batch_size]).to(pretrained.device)
                    layers_read.clear()
                    pretrained.model(input_ids=batch, use_cache=False, **logits)
                    check_every_layer_read(pretrained, layers_read)
                    rows = slice(start, start + len(batch))
                    writer.append(codes=recorder.pop(), labels={k: v[rows] for k, v in labels.items()}, split=split,
                                  extra={"token_ids": ids[rows]})
        except BaseException:
            writer.abort()
            raise
        finally:
            if bar is not None:
                bar.close()
        writer.close()
        return writer.image

    return record_in_shards(out, math.ceil(n / batch_size), record, append=append, overwrite=overwrite,
                            wait_for_lock=wait_for_lock, progress=progress)
