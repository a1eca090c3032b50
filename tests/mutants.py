"""Break on purpose the code each of the ten tests of tests/MUTATIONS.md claims to check, and see it fail.

    python tests/mutants.py            # every mutant
    python tests/mutants.py 5 8        # mutants 5 and 8 (the numbers of the table)
    python tests/mutants.py --before   # the tests as they were before they were strengthened, broken

For each mutant: the file must be as committed (git diff empty), the one change is made (its text
must occur exactly once), the test runs and must fail; the file is written back as it was (git
diff empty again), the test runs and must pass. One line per run; a Markdown row per mutant at the
end. Not a test module (pytest collects test_*.py only): it edits the package's files while it runs,
so run it in a worktree nobody else is using.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    number: str
    test: str  # pytest node id (or -k expression after "::-k ")
    path: str
    old: str
    new: str
    what: str
    slow: bool = False
    before: str = ""  # "COMMIT:path::function": the test as it was before it was strengthened


MUTANTS = [
    Mutant("1", "tests/test_per_rule.py", "latentcode/tasks/sraven.py",
           '"rules": rules,', '"rules": (rules + 1) % len(RULES),',
           "every instance's rule labels off by one (rule r labelled r + 1)",
           before="47009c0~1:tests/test_per_rule.py::test_the_per_rule_tables_add_up_to_the_recorded_accuracies"),
    Mutant("2a", "tests/test_shipped_models.py::-k held_out", "latentcode/models/positions.py",
           "np.log(distance.astype(np.float32) / max_exact", "np.log((distance + 1).astype(np.float32) / max_exact",
           "relative position buckets: the log-spaced distances off by one (d + 1)",
           before="e8898e9~1:tests/test_shipped_models.py::test_shipped_model_loads_and_solves_its_task"),
    Mutant("2b", "tests/test_shipped_models.py::-k held_out", "latentcode/models/positions.py",
           "rotated_half = torch.cat([-second, first], dim=-1)", "rotated_half = torch.cat([second, -first], dim=-1)",
           "rotary embedding rotated the other way",
           before="e8898e9~1:tests/test_shipped_models.py::test_shipped_model_loads_and_solves_its_task"),
    Mutant("3", "tests/relations/test_relation_codes.py::test_the_exact_ablation_of_every_head_equals_a_hand_written_attention",
           "latentcode/relations/induction.py",
           "edits = [ZeroAblate(heads=[head], sites=_sites(pairs, layer)) for layer, head in heads]",
           "edits = [ZeroAblate(heads=[head], sites=_sites(pairs, None)) for layer, head in heads]",
           "ablation_effect zeroes the head at the pairs of every layer, not of its own",
           before="c9f41d4~1:tests/relations/test_relation_codes.py::test_attribution_and_exact_ablation_of_the_strongest_head_agree_in_sign"),
    Mutant("4a", "tests/extraction/test_recorder.py::test_recorded_codes_equal_the_attention_computed_from_the_formulas",
           "latentcode/models/positions.py",
           "return self.bias_table[:, self.buckets[query_start:query_end, :n_keys]]",
           "return 0 * self.bias_table[:, self.buckets[query_start:query_end, :n_keys]]",
           "relative position bias dropped (multiplied by 0)",
           before="9584aef~1:tests/extraction/test_recorder.py::test_recorded_codes_equal_the_attention_computed_directly"),
    Mutant("4b", "tests/extraction/test_recorder.py::test_recorded_codes_equal_the_attention_computed_from_the_formulas",
           "latentcode/sources/attention_rows.py",
           "return attention[:, :, queries, keys]\n",
           "return attention[:, :, keys, queries]\n",
           "pairs read transposed (code of (key, query) recorded for (query, key))",
           before="9584aef~1:tests/extraction/test_recorder.py::test_recorded_codes_equal_the_attention_computed_directly"),
    Mutant("5a", "tests/intervention/test_patching.py::test_the_sweep_equals_one_interchange_per_group",
           "latentcode/sources/attention_rows.py",
           "    return gather_pairs(attention, pairs).detach().float()",
           "    return gather_pairs(attention, (pairs[0], (pairs[1] + 1) % attention.shape[-1])).detach().float()",
           "slice_pairs (the capture both the sweep and Interchange take the donor's codes from) reads each "
           "code one key to the right",
           before="7662700~1:tests/intervention/test_patching.py::test_the_sweep_equals_one_interchange_per_group"),
    Mutant("5b", "tests/intervention/test_patching.py::test_the_sweep_equals_one_interchange_per_group",
           "latentcode/sources/attention_rows.py",
           "edited[:, :, queries, keys] = codes.to(attention.dtype)",
           "edited[:, :, queries, (keys + 1) % attention.shape[-1]] = codes.to(attention.dtype)",
           "write_pairs (shared by the sweep and Interchange) writes each code one key to the right",
           before="7662700~1:tests/intervention/test_patching.py::test_the_sweep_equals_one_interchange_per_group"),
    Mutant("6", "tests/models/test_attention_paths.py::test_paths_keep_working_under_autocast",
           "latentcode/models/positions.py",
           "rotated_half = torch.cat([-second, first], dim=-1)", "rotated_half = torch.cat([second, -first], dim=-1)",
           "rotary embedding rotated the other way (every path alike)",
           before="02ecbab~1:tests/models/test_attention_paths.py::test_paths_keep_working_under_autocast"),
    Mutant("7", "tests/models/test_positions.py::test_every_bucket_equals_the_t5_formula",
           "latentcode/models/positions.py",
           "np.log(distance.astype(np.float32) / max_exact", "np.log((distance + 1).astype(np.float32) / max_exact",
           "relative position buckets: the log-spaced distances off by one (d + 1)",
           before="9584aef~1:tests/models/test_positions.py::test_paper_setting_buckets_equal_max_distance_equal_length"),
    Mutant("8", "tests/intervention/test_intervention_models.py::test_setting_every_code_to_its_own_value_changes_no_bit",
           "latentcode/intervention/intervener.py",
           "            sink(layer, record_queries, record_keys, edited[:, :, columns.to(edited.device)].detach().float())\n"
           "        return edited\n",
           "            sink(layer, record_queries, record_keys, edited[:, :, columns.to(edited.device)].detach().float())\n"
           "        return codes\n",
           "an intervention that does nothing (the editor returns the codes it was given)",
           before="9a07354~1:tests/intervention/test_intervention_models.py::test_setting_every_code_to_its_own_value_changes_no_bit"),
    Mutant("9", "tests/training/test_training.py::test_a_tiny_run_lowers_the_loss",
           "latentcode/training/objective.py",
           "return F.cross_entropy(predictions.float().flatten(0, 1), targets.long().flatten())",
           "return F.nll_loss(predictions.float().flatten(0, 1), targets.long().flatten())",
           "classification loss without its log-softmax (nll_loss of raw logits)",
           before="8c485ce~1:tests/training/test_training.py::test_a_tiny_run_lowers_the_loss"),
    Mutant("10a", "tests/test_analyses.py::test_heads_ablation_writes_each_runs_scores_for_its_head_count",
           "analyses/heads_ablation.py",
           'f"ood.{metric}": r.get(f"ood.{metric}")', 'f"ood.{metric}": r.get(f"test.{metric}")',
           "heads_ablation.py writes the test score in the OOD column", slow=True,
           before="ce5b491~1:tests/test_analyses.py::test_heads_ablation"),
    Mutant("10b", "tests/relations/test_relation_codes.py::test_smollm2_demo_writes_the_losses_of_a_hand_written_attention",
           "latentcode/relations/demo.py",
           "top, random_pairs(half, seed), attribution.base_loss)", "top, induction_pairs(half), attribution.base_loss)",
           "the demo's control ablates at the induction pairs, not at random pairs", slow=True,
           before="1ab7bbb~1:tests/relations/test_relation_codes.py::test_smollm2_demo_runs_and_writes_its_numbers"),
]


def git_clean(path: str) -> bool:
    return subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=ROOT).returncode == 0


def run_test(mutant: Mutant, node_spec: str | None = None) -> tuple[int, float, str]:
    node, _, keyword = (node_spec or mutant.test).partition("::-k ")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf", node]
    if keyword:
        command += ["-k", keyword]
    if mutant.slow:
        command += ["-m", "slow"]
    started = time.perf_counter()
    result = subprocess.run(["nice", "-n", "15", *command], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else result.stderr.strip().splitlines()[-1]
    failed = next((line for line in lines if line.startswith(("FAILED", "ERROR"))), "")
    return result.returncode, time.perf_counter() - started, f"{summary} {failed[:300]}".strip()


def run_before(mutant: Mutant) -> tuple[int, float, str]:
    """The test as it was before it was strengthened (its file from git, written beside today's as
    before_NAME.py for the run, then removed), on the mutated code."""
    revision_and_path, _, function = mutant.before.partition("::")
    revision, _, path = revision_and_path.partition(":")
    old = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True)
    copy = ROOT / Path(path).parent / f"before_{Path(path).name}"
    copy.write_text(old.stdout)
    try:
        return run_test(mutant, f"{copy.relative_to(ROOT)}::{function}")
    finally:
        copy.unlink()


def main(arguments: list[str]) -> int:
    before = "--before" in arguments
    numbers = [argument for argument in arguments if argument != "--before"]
    chosen = [mutant for mutant in MUTANTS if (not numbers or mutant.number in numbers) and (mutant.before or not before)]
    rows, all_ok = [], True
    for mutant in chosen:
        path = ROOT / mutant.path
        if not git_clean(mutant.path):
            print(f"{mutant.number}: {mutant.path} differs from HEAD; commit or restore it first", file=sys.stderr)
            return 2
        original = path.read_text()
        if original.count(mutant.old) != 1:
            print(f"{mutant.number}: the text to change occurs {original.count(mutant.old)} times in {mutant.path}",
                  file=sys.stderr)
            return 2
        line = original[: original.index(mutant.old)].count("\n") + 1
        if before:  # the old test on the broken code: passes where it was too weak to notice
            try:
                path.write_text(original.replace(mutant.old, mutant.new))
                rc, seconds, outcome = run_before(mutant)
            finally:
                path.write_text(original)
            assert git_clean(mutant.path), f"{mutant.path} was not restored"
            print(f"{mutant.number} before ({mutant.before}) on the broken code: rc={rc} ({seconds:.0f} s) {outcome}",
                  flush=True)
            rows.append(f"| {mutant.number} | `{mutant.before}` | {'passes' if rc == 0 else 'fails' if rc == 1 else f'rc {rc}'}: {outcome} |")
            continue
        try:
            path.write_text(original.replace(mutant.old, mutant.new))
            broken_rc, broken_seconds, broken_line = run_test(mutant)
        finally:
            path.write_text(original)
        assert git_clean(mutant.path), f"{mutant.path} was not restored"
        restored_rc, restored_seconds, restored_line = run_test(mutant)
        ok = broken_rc == 1 and restored_rc == 0
        all_ok &= ok
        print(f"{mutant.number} {mutant.path}:{line}: broken rc={broken_rc} ({broken_seconds:.0f} s) {broken_line} | "
              f"restored rc={restored_rc} ({restored_seconds:.0f} s) {restored_line} | {'OK' if ok else 'NOT OK'}",
              flush=True)
        rows.append(f"| {mutant.number} | `{mutant.test}` | `{mutant.path}:{line}` {mutant.what}: "
                    f"`{mutant.old.strip()}` -> `{mutant.new.strip()}` | "
                    f"{'fails' if broken_rc == 1 else f'rc {broken_rc}'}: {broken_line} | "
                    f"{'passes' if restored_rc == 0 else f'rc {restored_rc}'}: {restored_line} |")
    print("\n".join(rows))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
