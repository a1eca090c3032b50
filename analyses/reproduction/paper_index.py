"""The page's index: every figure and table of "Attention as a Hypernetwork" (Schug et al., ICLR 2025)
mapped to what reproduces it here (script, command, output, section of the page) or to the reason it is
not reproduced. What each shows is the paper's claim as the scripts under analyses/ quote it.

An item counts as reproduced when its script exists and each of its outputs (files under analyses/) is
recorded; an item with nothing recorded says why (tests/test_analyses_index.py holds both).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ROOT
from .code_figures import FIG3_FUZZY, FIG3_SRAVEN, FIG4


@dataclass(frozen=True)
class PaperItem:
    item: str  # "Fig. 2C", "Table A2"
    shows: str  # the paper's claim, as the scripts quote it
    script: str | None = None  # the file that makes it, relative to the repository root
    command: str | None = None  # what regenerates it
    outputs: tuple[str, ...] = ()  # recorded files, relative to analyses/ (links on the page)
    section: str | None = None  # the page's heading (after "## ") where it is shown
    reason: str | None = None  # why it is not reproduced, or not recorded yet

    @property
    def missing(self) -> list[str]:
        """Its outputs not recorded under analyses/."""
        return [output for output in self.outputs if not (ROOT / output).is_file()]

    @property
    def reproduced(self) -> bool:
        return (self.script is not None and (ROOT.parent / self.script).is_file()
                and bool(self.outputs or self.section) and not self.missing)


def _recorded(result, names) -> tuple[str, ...]:
    return tuple(f"results/{result.folder}/{name}" for name in names)


_TSNE = ("softmax_tsne.png", "linear_tsne.png", "hyla_tsne.png")
_SLOW_TSNE = ("not recorded yet: `python analyses/reproduce.py code-figures --only fig3_sraven fig3_fuzzy_logic`, "
              "then `page`. It was started and stopped: on the shared 2-core machine (load average 12) the tSNE of "
              "2,000 codes of one layer took 11 minutes, and the two tasks have 18 model layers")

PAPER = (
    PaperItem("Fig. 1", "multi-head attention as a hypernetwork: the H scores of a key-query pair are a latent code "
              "that configures a key-query specific value network; HYLA",
              reason="a diagram, not a measurement: its equations are the attention layer "
                     "(latentcode/models/attention.py, value_network.py), checked against a reference by "
                     "tests/models/test_attention_paths.py"),
    PaperItem("Fig. 2A", "the fuzzy-logic task",
              reason="a drawing of the task, which is latentcode/tasks/fuzzy_logic.py"),
    PaperItem("Fig. 2B", "the terms of unseen compositions are decodable from the latent codes",
              script="analyses/fuzzy_term_decoding.py", command="python analyses/reproduce.py decoding",
              outputs=("results/decoding/fuzzy_logic_term_decoding.png",
                       "results/decoding/fuzzy_logic_term_decoding.csv"),
              section="Fig. 2B / 5F: decoding the sub-task"),
    PaperItem("Fig. 2C", "OOD R² falls as more term combinations are held out, HYLA's least",
              script="analyses/reproduce.py", command="python analyses/reproduce.py train --only table_a1 fig2c",
              outputs=("results/figures/fig2c_ood_r2_vs_held_out.png",), section="Fig. 2C"),
    PaperItem("Fig. 3", "the latent codes of unseen compositions cluster by the sub-task (tSNE): SRAVEN by the "
              "query's rule, fuzzy logic by the function's terms", script="analyses/latent_tsne.py",
              command="python analyses/reproduce.py code-figures --only fig3_sraven fig3_fuzzy_logic",
              outputs=_recorded(FIG3_SRAVEN, _TSNE) + _recorded(FIG3_FUZZY, _TSNE),
              section="Fig. 3 and Fig. 4", reason=_SLOW_TSNE),
    PaperItem("Fig. 4", "the mean latent codes of the SRAVEN rules are structured: cosine similarity of each pair "
              "of rules", script="analyses/sraven_rule_heatmap.py",
              command="python analyses/reproduce.py code-figures --only fig4",
              outputs=_recorded(FIG4, ("rule_similarity.png", "rule_similarity_centred.png")),
              section="Fig. 3 and Fig. 4"),
    PaperItem("Fig. 5C", "a single head (no latent code to speak of) generalizes worse than 16",
              script="analyses/reproduce.py", command="python analyses/reproduce.py train --only sraven fig5c",
              section="Fig. 5C"),
    PaperItem("Fig. 5F", "the rule is decodable from the latent codes of unseen rule combinations",
              script="analyses/sraven_rule_decoding.py", command="python analyses/reproduce.py decoding",
              outputs=("results/decoding/sraven_rule_decoding.png",
                       "results/decoding/sraven_permuted_rule_decoding.png"),
              section="Fig. 2B / 5F: decoding the sub-task"),
    PaperItem("Fig. 5, other panels", "SRAVEN panels no script here names: the task drawing, and the abstract's "
              "claim that scaling model size and data brings compositional generalization",
              reason="the paper's SRAVEN scale (M = 4 features) leaves a model near chance within a 2-core CPU's "
                     "budget (section SRAVEN on the permuted task); the runs here are M = 2, one model size, so no "
                     "scaling sweep"),
    PaperItem("Fig. 6", "language modelling: HYLA better than linear attention, close to softmax",
              script="analyses/reproduce.py",
              command="python analyses/reproduce.py train --only language language_budget",
              outputs=("results/figures/language_bits_per_byte.png", "results/figures/language_bits_per_byte_4k.png"),
              section="Fig. 6"),
    PaperItem("Table A1, fuzzy logic", "OOD R² of softmax, linear and HYLA attention and the ablations",
              script="analyses/reproduce.py", command="python analyses/reproduce.py train --only table_a1 ablations",
              section="Table A1, fuzzy-logic column"),
    PaperItem("Table A1, SRAVEN", "OOD accuracy of softmax, linear and HYLA attention on SRAVEN",
              script="analyses/reproduce.py", command="python analyses/reproduce.py train --only sraven",
              outputs=("results/figures/sraven_permuted_accuracy_vs_step.png",),
              section="SRAVEN on the permuted task"),
    PaperItem("Table A2", "the fraction of ambiguous SRAVEN instances, by the number of values K",
              script="analyses/reproduction/sraven.py",
              command="latentcode tasks ambiguity --features 4 --values K --n 4096 --rules strict\\|authors",
              section="Table A2"),
)


def unaccounted(items=PAPER) -> list[PaperItem]:
    """The items with neither a script and its recorded output nor a reason: none, on a true index."""
    return [item for item in items if not item.reproduced and not item.reason]


def _links(outputs) -> str:
    return ", ".join(f"[{output.split('/', 1)[1]}]({output})" for output in outputs)


def paper_index() -> str:
    """The index as a markdown table, one row per item of PAPER."""
    lines = ["| paper | what it shows | reproduced by | output | on this page |", "|---|---|---|---|---|"]
    for item in PAPER:
        made_by = f"`{item.script}`: `{item.command}`" if item.script else "–"
        if item.reproduced:
            output = _links(item.outputs) if item.outputs else "the table on this page"
            section = f"§ {item.section}" if item.section else "–"
        else:
            output, section = f"not reproduced: {item.reason or f'not recorded yet: `{item.command}`'}", "–"
        lines.append(f"| {item.item} | {item.shows} | {made_by} | {output} | {section} |")
    return "\n".join(lines)


def code_figures_section() -> str:
    """Fig. 3 and Fig. 4's figures where recorded, else the command that records them."""
    parts = []
    for item in (figure for figure in PAPER if figure.item in ("Fig. 3", "Fig. 4")):
        if item.reproduced:
            parts += [f"**{item.item}** (`{item.command}`): {item.shows}.", "",
                      *(f"![{item.item}: {output}]({output})" for output in item.outputs
                        if output.endswith(".png")), ""]
        else:
            parts += [f"**{item.item}**: {item.reason or f'not recorded yet: `{item.command}`, then `page`'}.", ""]
    return "\n".join(parts).rstrip()
