"""`latentcode view`'s token view (`--view tokens`, the default for a language model's file with a
compact store) and its local server (`--serve`): the options, their checks before any work, and the
run. The page and the server are `latentcode.analysis.viewer.token_page` and `.serve`."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from latentcode.cli.arguments import POSITIVE_INTEGER
from latentcode.errors import UsageError

TOKEN_IDS = "token_ids"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--view", choices=("tokens", "codes"),
                        help="tokens: the text as tokens, click one for every head's attention from it (the "
                        "default for a file that keeps its token ids and a compact store); codes: the embedding "
                        "of the codes and their grid (the default otherwise)")
    parser.add_argument("--serve", action="store_true",
                        help="instead of writing a page, serve the token view on 127.0.0.1 (this machine only), "
                        "every row rebuilt from the file's compact store when asked: any query at any length; "
                        "the first line printed is the address; Ctrl-C stops it (exit 0)")
    parser.add_argument("--port", type=POSITIVE_INTEGER, help="with --serve: the port (default: a free one)")
    parser.add_argument("--example", type=int, default=0,
                        help="the token view's example (a row of the file; default 0); --serve offers every one")


def check_token_view(args: argparse.Namespace, code_file) -> None:
    """Which view (`args.view`), and every mistake of the token view's options, before any work."""
    has_tokens = TOKEN_IDS in code_file.extra_names
    args.view_by_default = args.view is None
    if args.view is None:
        args.view = "tokens" if args.serve or (has_tokens and code_file.compact is not None) else "codes"
    if args.port is not None and not args.serve:
        raise UsageError(f"--port {args.port} applies to --serve; add --serve, or drop --port")
    if args.view == "codes":
        if args.serve:
            raise UsageError("--serve serves the token view; drop --view codes (the codes view is a page: --out)")
        return
    if not has_tokens:
        raise UsageError(f"{args.file} keeps no token ids (/extra/{TOKEN_IDS}); the token view shows a language "
                         "model's input tokens: give a file written by latentcode extract of a language model, or "
                         "--view codes")
    if args.serve and code_file.compact is None:
        raise UsageError(f"{args.file} has no compact store (/compact); --serve rebuilds every row from it: extract "
                         "with a compact store (latentcode extract of a pretrained model keeps one), or drop --serve "
                         "for a static page of the sites the file records")
    if not 0 <= args.example < len(code_file):
        raise UsageError(f"--example {args.example} is outside the {len(code_file)} examples of {args.file}; "
                         f"expected 0..{len(code_file) - 1}")
    codes_only = [flag for flag, given in (("--embedding", args.embedding), ("--probes", args.probes),
                                           ("--patching", args.patching), ("--color", args.label)) if given]
    if codes_only:
        raise UsageError(f"{' '.join(codes_only)} belong to the codes view; add --view codes, or drop them")
    if args.serve:
        if args.out is not None:
            raise UsageError(f"--out {args.out} with --serve: the server writes no page; drop one of them")
        if args.port is not None:
            check_port_free(args.port)


def check_port_free(port: int) -> None:
    """A UsageError (one line) if 127.0.0.1:`port` cannot be listened on now."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", port))
    except OSError as error:
        raise UsageError(f"--port {port}: 127.0.0.1:{port} is not free ({error.strerror or error}); expected a free "
                         "port, or leave --port out for any free one") from None
    finally:
        probe.close()


def run_token_view(args: argparse.Namespace, token_names) -> int:
    """Serve the token view (until Ctrl-C), or write its static page to --out."""
    from latentcode.store import CodeFile

    code_file = CodeFile(args.file)
    if args.serve:
        from latentcode.allocator import one_arena_returning_memory
        from latentcode.analysis.viewer.serve import serve_token_view

        # A server of its own process: one malloc arena, freed memory handed back after each answer.
        return serve_token_view(code_file, token_names, args.port or 0,
                                ready=lambda address: print(address, flush=True),
                                release_memory=one_arena_returning_memory())
    from latentcode.analysis.viewer.token_page import build_token_viewer

    viewer = build_token_viewer(code_file, example=args.example, token_names=token_names)
    path = viewer.save(Path(args.out), overwrite=args.overwrite)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; token view: {viewer.title})")
    return 0
