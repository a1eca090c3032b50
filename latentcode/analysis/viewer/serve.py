"""`latentcode view FILE --serve`: the token view with rows on demand, from a local server of the
standard library (`http.server.ThreadingHTTPServer`) bound to 127.0.0.1 only.

Why a server: a page cannot hold every row at T = 8,192 (30 layers x 9 heads x T^2 codes), but one
row is rebuilt from the compact store in milliseconds (`CompactCodes.rows`). The page asks for the
row of the query clicked, of the layer shown, and nothing leaves the machine:

    GET /                                       the page (`token_page`, connect-src 'self')
    GET /rows?example=E&layer=L&query=Q         float32 [H, T], little-endian bytes
    GET /overview?example=E&query=Q             JSON [layer][head] -> [top key, its code, entropy]
    GET /block?example=E&layer=L&head=H&q0=&q1=&k0=&k1=   float32 [q1 - q0, k1 - k0] (at most 512 x 8192)
    GET /tokens?example=E                       JSON {ids, texts}

A request whose Host is not this server's address (127.0.0.1:PORT or localhost:PORT), or whose
Origin is another site, is refused (403): a web page elsewhere cannot read the file through it
(DNS rebinding, cross-site requests).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import numpy as np

from latentcode.analysis.viewer.token_page import page_title, token_page, token_payload
from latentcode.analysis.viewer.token_rows import TokenRows
from latentcode.errors import AnalysisError, UsageError
from latentcode.store import CodeFile

__all__ = ["MAX_BLOCK_QUERIES", "RowServer", "serve_token_view"]

HOST = "127.0.0.1"
MAX_BLOCK_QUERIES = 512


class RowServer(ThreadingHTTPServer):
    """The server of one codes file's token view (see the module); `address` is its URL."""

    daemon_threads = True

    def __init__(self, code_file: CodeFile, token_names: Sequence[str] | None = None, port: int = 0):
        if code_file.compact is None:
            raise AnalysisError(f"{code_file.path} has no compact store (/compact); --serve rebuilds rows from it: "
                                "extract with a compact store (latentcode extract of a pretrained model keeps one) "
                                "or drop --serve for a static page of the recorded sites")
        self.rows = TokenRows(code_file, token_names)  # one file read at a time, a lock per row
        self.rows_waiting, self.rows_waiting_lock = 0, threading.Lock()
        self.connections: dict[socket.socket, threading.Thread] = {}  # open connections and their threads
        self.connections_lock = threading.Lock()
        try:
            super().__init__((HOST, port), RowHandler)
        except OSError as error:
            raise UsageError(f"--port {port}: cannot listen on {HOST}:{port} ({error.strerror or error}); "
                             "expected a free port, or leave --port out for any free one") from None
        self.release_memory = lambda: None  # serve_token_view's, where the process is the server's own
        self.port = self.server_address[1]
        self.address = f"http://{HOST}:{self.port}/"
        self.allowed_hosts = {f"{HOST}:{self.port}", f"localhost:{self.port}"}
        self.allowed_origins = {f"http://{host}" for host in self.allowed_hosts}
        payload = token_payload(self.rows, 0, "served")
        self.page = token_page(payload, page_title(self.rows, 0).replace("example 0 of", "examples: "),
                               f"Served from {self.address} (this machine only); rows rebuilt from "
                               f"{code_file.path.name}'s compact store on request.").encode("utf-8")

    # A clicked row goes before the overviews (30 rows each) asked earlier: an overview waits, between
    # its layers, while any row is asked.
    @contextlib.contextmanager
    def row_asked(self):
        with self.rows_waiting_lock:
            self.rows_waiting += 1
        try:
            yield
        finally:
            with self.rows_waiting_lock:
                self.rows_waiting -= 1

    def rows_first(self) -> None:
        for _ in range(2000):  # at most 2 s
            if not self.rows_waiting:
                return
            time.sleep(0.001)

    def process_request(self, request, client_address) -> None:
        """Each connection in a thread of its own, remembered until it ends (see `close_connections`)."""
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address), daemon=True)
        with self.connections_lock:
            self.connections[request] = thread
        thread.start()

    def shutdown_request(self, request) -> None:
        with self.connections_lock:
            self.connections.pop(request, None)
        super().shutdown_request(request)

    def close_connections(self, wait: float = 5.0) -> None:
        """End every open connection (a browser tab keeps one open between requests) and wait up to `wait`
        seconds for their threads: none may be left reading the file, or holding stderr, as the process
        closes the file and exits (a thread left so hung the server's exit after Ctrl-C)."""
        with self.connections_lock:
            connections = dict(self.connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)  # its thread's read returns: the connection ends
        deadline = time.monotonic() + wait
        for thread in connections.values():
            thread.join(max(0.0, deadline - time.monotonic()))

    def handle_error(self, request, client_address) -> None:
        # A page closed or reloaded while its answer was written, or a connection ended by
        # close_connections: nothing to report on the terminal.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def server_bind(self) -> None:
        # No SO_REUSEADDR: a port another process listens on is refused, not shared.
        self.allow_reuse_address = False
        if hasattr(socket, "SO_REUSEADDR"):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        super().server_bind()


class RowHandler(BaseHTTPRequestHandler):
    server: RowServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: an answer is written as its headers, then its body; with Nagle's algorithm the body's
    # last segment waited for the browser's delayed acknowledgement of the headers (up to 40 ms a row).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would bury the address line

    def _send(self, status: int, body: bytes, content_type: str, timing: float | None = None) -> None:
        self.send_response(status)
        if timing is not None:  # the seconds spent on the answer, for the page's own figures (benchmarks)
            self.send_header("Server-Timing", f"work;dur={timing * 1000:.1f}")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, text: str) -> None:
        self._send(status, text.encode("utf-8"), "text/plain; charset=utf-8")

    def _same_origin(self) -> bool:
        if self.headers.get("Host", "") not in self.server.allowed_hosts:
            return False
        origin = self.headers.get("Origin")
        if origin is not None and origin not in self.server.allowed_origins:
            return False
        return self.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if not self._same_origin():
            return self._refuse(HTTPStatus.FORBIDDEN, f"only {self.server.address} itself may ask this server")
        url = urlsplit(self.path)
        query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        try:
            if url.path in ("/", "/index.html"):
                return self._send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
            if url.path == "/rows":
                started = time.perf_counter()
                with self.server.row_asked():
                    row = self.server.rows.row(_int(query, "example"), _int(query, "layer"), _int(query, "query"))
                return self._send(HTTPStatus.OK, np.ascontiguousarray(row, dtype="<f4").tobytes(),
                                  "application/octet-stream", time.perf_counter() - started)
            if url.path == "/overview":
                summary = self.server.rows.overview(_int(query, "example"), _int(query, "query"),
                                                    before_layer=self.server.rows_first)
                self.server.release_memory()  # 30 layers' keys read and freed
                return self._send(HTTPStatus.OK, json.dumps(summary).encode(), "application/json")
            if url.path == "/block":
                q0, q1, k0, k1 = (_int(query, name) for name in ("q0", "q1", "k0", "k1"))
                if q1 - q0 > MAX_BLOCK_QUERIES:
                    raise AnalysisError(f"a block of {q1 - q0} queries; at most {MAX_BLOCK_QUERIES}")
                block = self.server.rows.block(_int(query, "example"), _int(query, "layer"), _int(query, "head"),
                                               range(q0, q1), range(k0, k1))
                return self._send(HTTPStatus.OK, np.ascontiguousarray(block, dtype="<f4").tobytes(),
                                  "application/octet-stream")
            if url.path == "/tokens":
                ids = self.server.rows.token_ids(_int(query, "example"))
                names = self.server.rows.token_names
                body = {"ids": ids.tolist(), "texts": {str(i): names[i] for i in np.unique(ids).tolist()}}
                return self._send(HTTPStatus.OK, json.dumps(body).encode(), "application/json")
        except AnalysisError as error:
            return self._refuse(HTTPStatus.BAD_REQUEST, str(error))
        return self._refuse(HTTPStatus.NOT_FOUND, f"no {url.path} here; expected /, /rows, /overview, /block, /tokens")

    def do_POST(self) -> None:  # noqa: N802
        self._refuse(HTTPStatus.METHOD_NOT_ALLOWED, "this server only answers GET")


def _int(query: dict, name: str) -> int:
    try:
        return int(query[name])
    except (KeyError, ValueError):
        raise AnalysisError(f"parameter {name}={query.get(name)!r}; expected an integer") from None


def serve_token_view(code_file: CodeFile | str, token_names: Sequence[str] | None = None, port: int = 0,
                     ready=print, release_memory=None) -> int:
    """Serve the token view of `code_file` until Ctrl-C; `ready(address)` is called once listening.
    Returns 0 once stopped by Ctrl-C (after one line saying so). `release_memory`: called after the
    file is opened and after each answer (the command line passes
    `latentcode.allocator.one_arena_returning_memory()`; the process's allocator is the caller's)."""
    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    server = RowServer(code_file, token_names, port)
    if release_memory is not None:
        server.release_memory = release_memory
    server.release_memory()  # what opening the file (its check reads every query and key) left behind
    try:  # a Ctrl-C right after the address is printed stops the server as one later does
        ready(server.address)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        print(f"stopped serving {server.address}", flush=True)
    finally:
        server.server_close()
        server.close_connections()
        code_file.compact.close()
    return 0
