"""Extraction overhead on Hugging Face models built from configs (random weights, no download):
a forward pass under a `Recorder` versus a bare `torch.no_grad()` forward on the same batches. The goal
is a ratio of at most 1.25.

    python benchmarks/bench_extract_hf.py [--batches 8] [--batch-size 16] [--length 128] [--repeats 5]

Models: GPT-2 with `attn_implementation="eager"` (read by `SoftmaxSource`, at the softmax) and BART with
the default SDPA (read by `TorchAttentionSource`, cross-attention included); 4 layers (BART: 4 + 4),
d_model 256, 8 heads. Sites: `last-self` in every attention layer. Prints the median over repeats
(bare and recorded interleaved, so both see the same machine load) and their ratio. Recording only:
the HDF5 writing is timed by `bench_extract.py`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from latentcode.extraction import Recorder
from latentcode.sources import detect_source


def models(length: int) -> dict[str, tuple[torch.nn.Module, callable]]:
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=256, n_layer=4, n_head=8, vocab_size=1000, n_positions=length, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager",
    )).eval()  # fmt: skip
    bart = transformers.BartModel(transformers.BartConfig(
        vocab_size=1000, d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=length,
    )).eval()  # fmt: skip
    return {
        "gpt2-eager (SoftmaxSource)": (gpt2, lambda ids: {"input_ids": ids}),
        "bart-sdpa (TorchAttentionSource, cross)": (bart, lambda ids: {"input_ids": ids, "decoder_input_ids": ids[:, : len(ids[0]) // 2]}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 1000, (args.batch_size, args.length), generator=generator) for _ in range(args.batches)]
    batches = [ids.to(args.device) for ids in batches]

    for name, (model, inputs_of) in models(args.length).items():
        model.to(args.device)
        source = detect_source(model)
        bare_median, recorded_median = timings(model, inputs_of, source, batches, args.repeats, args.device)
        print(f"{name:42s} [{args.device}] bare {bare_median * 1e3:8.1f} ms  recorded {recorded_median * 1e3:8.1f} ms  "
              f"ratio {recorded_median / bare_median:.3f}  ({type(source).__name__}, layers {source.layer_names()})")


def timings(model, inputs_of, source, batches, repeats: int, device: str) -> tuple[float, float]:
    """Median seconds of a bare pass over `batches` and of one under a Recorder (interleaved)."""

    def synchronize():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def bare() -> float:
        synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            for ids in batches:
                model(**inputs_of(ids))
        synchronize()
        return time.perf_counter() - start

    def recorded() -> float:
        synchronize()
        start = time.perf_counter()
        with torch.no_grad(), Recorder(model, "last-self", source=source) as recorder:
            for ids in batches:
                model(**inputs_of(ids))
                recorder.pop()
        synchronize()
        return time.perf_counter() - start

    bare(), recorded()  # warm-up
    bare_times, recorded_times = [], []
    for _ in range(repeats):
        bare_times.append(bare())
        recorded_times.append(recorded())
    return statistics.median(bare_times), statistics.median(recorded_times)

if __name__ == "__main__":
    main()
