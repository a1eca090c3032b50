"""`latentcode view`: one self-contained, offline HTML page to explore the latent codes of a codes file,
or of a run directory (its codes extracted first with `latentcode.extract`, as `latentcode extract` would)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from latentcode.analysis.checks import check_input_file, check_label, check_splits, label_name, open_codes_files
from latentcode.cli.arguments import POSITIVE_INTEGER, SEED
from latentcode.cli.command import Command, command_parser
from latentcode.cli.view_tokens import add_arguments as add_token_arguments
from latentcode.cli.view_tokens import check_token_view, run_token_view
from latentcode.errors import UsageError
from latentcode.validation import check_output


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        subparsers, "view", help="an interactive offline HTML page of the latent codes of a codes file",
        description="Write one self-contained HTML page (plotly.js inline, no network request) that links: the "
        "PCA (or tSNE/UMAP) embedding of each layer's codes, hovered for an instance's labels and the model's "
        "answer, filtered by any label; the selected instance's codes as a layer x head grid and its attention from "
        "the query to every recorded key, per head (keys named by their tokens where the file names them, or for a "
        "pretrained model's file, by its tokenizer: the model it names, here with the same SHA-256); probe tables "
        "and patching maps when given. At most "
        "--max-instances instances, drawn with --seed; codes rounded for display.",
        epilog="examples:\n  latentcode view codes.h5 --probes results/rule.csv --patching results/patch.csv --out "
               "codes.html\n"
        "  latentcode view models/fuzzy_logic-hyla --sites '*:-1:*' --codes fuzzy-hyla.h5   # a run: extracted first")
    parser.add_argument("file", metavar="CODES.h5|RUN_DIR",
                        help="a codes file, or a run or model directory whose codes are extracted first (latentcode "
                        "extract's defaults: the task's held-out split, --n 8192, --sites last-self)")
    parser.add_argument("--split", help="only this split (default: all; of a RUN_DIR: the task's held-out split)")
    parser.add_argument("--sites", help="of a RUN_DIR: the site selector to extract (default last-self; '*:-1:*' "
                        "fills the attention panel: the last query to every key)")
    parser.add_argument("--n", type=POSITIVE_INTEGER, help="of a RUN_DIR: instances to extract (default 8192)")
    parser.add_argument("--codes", help="of a RUN_DIR: keep the extracted codes in this file (default: a temporary "
                        "file, deleted once the page is written)")
    parser.add_argument("--max-instances", type=POSITIVE_INTEGER, default=1000,
                        help="cap on the instances shown, drawn uniformly with --seed (default 1000)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--color", dest="label", help="label to colour by first (default: the task's picture label)")
    parser.add_argument("--embedding", action="append", choices=("tsne", "umap"), default=[],
                        help="also compute this embedding of the same instances (tens of seconds a layer); repeatable")
    parser.add_argument("--probes", action="append", default=[], metavar="CSV",
                        help="a latentcode probe table (.csv) to show; repeatable")
    parser.add_argument("--patching", action="append", default=[], metavar="CSV",
                        help="a latentcode patch table (.csv) to show as a map; repeatable")
    parser.add_argument("--out", help="the HTML file (default: beside the codes file, CODES.html; of a RUN_DIR: "
                        "NAME.html in the current directory, NAME the directory's name)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_token_arguments(parser)
    return parser


RUN_ONLY_FLAGS = ("--sites", "--n", "--codes")


def check(args: argparse.Namespace) -> None:
    args.extraction = None
    if Path(args.file).is_dir():
        if args.serve or args.view == "tokens":
            raise UsageError(f"{args.file} is a directory; the token view (--view tokens, --serve) reads a codes "
                             "file of a language model: give that file")
        args.view = "codes"
        _check_run(args)
        args.out = args.out or f"{Path(args.file).resolve().name}.html"
    else:
        given = [flag for flag in RUN_ONLY_FLAGS if getattr(args, flag.strip("-")) is not None]
        if given:
            raise UsageError(f"{' '.join(given)} apply to a RUN_DIR, whose codes are extracted; {args.file} is a "
                             "codes file: drop them, or give the run directory")
        [code_file] = open_codes_files([args.file])
        check_splits(code_file, {"--split": args.split})
        if args.label is not None:
            check_label(code_file, args.label, "--color")
        check_token_view(args, code_file)
        if args.serve:
            return
    for flag, paths in (("--probes", args.probes), ("--patching", args.patching)):
        for path in paths:
            if Path(path).suffix.lower() != ".csv":
                raise UsageError(f"{flag} {path} is not a .csv file; expected the table latentcode "
                                 f"{flag.strip('-').replace('patching', 'patch').rstrip('s')} wrote (STEM.csv)")
            check_input_file(path, flag)
    args.out = args.out or str(Path(args.file).with_suffix(".html"))
    if args.codes is not None and Path(args.codes).suffix.lower() not in (".h5", ".hdf5"):
        raise UsageError(f"--codes {args.codes} does not end in .h5; expected the name of the codes file to write")
    if Path(args.out).suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out {args.out} does not end in .html; expected the name of the HTML page to write")
    check_output(args.out, "--out", kind="file")
    if Path(args.out).exists() and not args.overwrite:
        raise FileExistsError(f"--out {args.out} already exists; pass overwrite=True (--overwrite) to replace it, or "
                              "choose another --out")


def _check_run(args: argparse.Namespace) -> None:
    """A run or model directory: the extraction `latentcode extract RUN_DIR` would plan (its defaults
    where --split, --sites, --n are not given), into --codes or a temporary file made by `run`."""
    from latentcode.extraction.plan import plan_extract
    from latentcode.rundir import RunDirectoryError, locate_model
    from latentcode.subject import subject_of

    try:
        source = locate_model(args.file)
    except RunDirectoryError:
        raise UsageError(f"{args.file} is a directory but neither a codes file (.h5) nor a run or model directory "
                         "(with model/model.safetensors or model.safetensors); expected one of them") from None
    if subject_of(source).reads_text:
        raise UsageError(f"{args.file} is a pretrained model; latentcode view reads a run directory of a latentcode "
                         "task or a codes file: extract its codes first (latentcode extract) and view that file")
    # The temporary file is made by `run`; its directory is checked here through a name not taken.
    out = args.codes or Path(tempfile.gettempdir()) / f"latentcode-view-{os.getpid()}.h5"
    args.extraction = dict(run_or_model=source, sites=args.sites or "last-self", split=args.split, n=args.n or 8192)
    plan = plan_extract(**args.extraction, out=out)  # every mistake now, before torch
    args.split = plan.split  # the page shows the split extracted (the task's held-out one by default)


def _extracted(args: argparse.Namespace, directory: str) -> str:
    """The run's codes, extracted as planned into --codes or `directory`."""
    import latentcode

    out = args.codes or str(Path(directory) / f"{Path(args.file).resolve().name}.h5")
    print(f"extracting the codes of {args.file}: {args.extraction['n']} instances of split {args.split} at "
          f"{args.extraction['sites']} into {args.codes or 'a temporary file'}", flush=True)
    latentcode.extract(**args.extraction, out=out, progress=False)
    if args.label is not None:
        from latentcode.store import CodeFile

        check_label(CodeFile(out), args.label, "--color")
    return out


def run(args: argparse.Namespace) -> None:
    if args.extraction is None:
        return _view(args, args.file)
    with tempfile.TemporaryDirectory(prefix="latentcode-view-", ignore_cleanup_errors=True) as directory:
        return _view(args, _extracted(args, directory))


def _view(args: argparse.Namespace, codes: str) -> int | None:
    from latentcode.store import CodeFile

    names = pretrained_token_names(codes)
    if args.view == "tokens":
        if names is not None or CodeFile(codes).token_names or not args.view_by_default:
            return run_token_view(args, names)
        print("the token view needs the text of the tokens: the codes view instead", flush=True)
    from latentcode.analysis import embed
    from latentcode.analysis.viewer import build_viewer

    args.file = codes
    embeddings = [embed(args.file, method, split=args.split, max_points=args.max_instances, seed=args.seed)
                  for method in args.embedding]
    viewer = build_viewer(args.file, split=args.split, max_instances=args.max_instances, seed=args.seed,
                          embeddings=embeddings, probe_tables=args.probes, patching=args.patching,
                          label=args.label and label_name(args.label), token_names=names)
    path = viewer.save(args.out, overwrite=args.overwrite)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; {viewer.title})")


def pretrained_token_names(path: str) -> list[str] | None:
    """The text of each token id of a pretrained model's codes file, so that the page names keys by
    their tokens: read from the tokenizer of the model the file names (root attribute `model_path`, or
    a known name such as smollm2) when it is here and its SHA-256 is the file's `checkpoint_sha256`;
    else None (keys named by position), and one line saying why. None, silently, for a file that names
    its tokens itself or records none."""
    from latentcode.pretrained import PretrainedError, token_texts_of
    from latentcode.rundir import PRETRAINED_NAMES
    from latentcode.store import CodeFile

    code_file = CodeFile(path)
    model_path = str(code_file.attrs.get("model_path") or "")
    if code_file.token_names or "token_ids" not in code_file.extra_names or not (
            model_path or code_file.compact is not None or code_file.model_name in PRETRAINED_NAMES):
        return None
    try:
        names = token_texts_of(model_path, code_file.model_name, str(code_file.attrs.get("checkpoint_sha256") or ""))
    except PretrainedError as error:
        print(f"keys named by position, not by token: {path}: {error}", flush=True)
        return None
    largest = int(code_file.extra("token_ids").max())
    if largest >= len(names):
        print(f"keys named by position, not by token: {path} holds token id {largest}, beyond the {len(names)} "
              "tokens of its model's tokenizer", flush=True)
        return None
    return names


COMMAND = Command(register, check, run, order=95, parameters={"run_or_model": "file", "out": "codes"})
