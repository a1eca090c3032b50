"""`latentcode view` of a language model's file: the token view by default, its server on 127.0.0.1
(rows as the compact store rebuilds them, other hosts and origins refused, Ctrl-C a clean stop), and
each bad input refused in one line. No browser here (test_token_view_browser.py has one)."""

from __future__ import annotations

import http.client
import json
import socket
import threading

import numpy as np
import pytest

from latentcode.analysis.viewer.serve import RowServer
from latentcode.cli import main
from latentcode.store import CodeFile, CodeWriter, Site
from tests.analysis.token_files import Served, tiny_token_file


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(the tiny model, its file with a compact store, one without, one without token ids)."""
    import latentcode

    directory = tmp_path_factory.mktemp("token-cli")
    model, codes = tiny_token_file(directory)
    bare = latentcode.extract(model, {"seq_len": 16}, "*:-1:*", n=1, compact=False, out=directory / "bare.h5",
                              progress=False)
    toy = directory / "toy.h5"
    with CodeWriter(toy, [Site(0, 1, 0)], n_heads=2, metadata={"model_name": "toy", "task_config": {}}) as writer:
        writer.append(codes={Site(0, 1, 0): np.zeros((3, 2), np.float32)}, labels={"size": np.arange(3)}, split="train")
    return model, codes, bare, toy


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_extraction_keeps_the_text_of_every_token_id(files):
    import transformers

    model, codes, _, _ = files
    tokenizer = transformers.AutoTokenizer.from_pretrained(model, local_files_only=True)
    assert CodeFile(codes).token_names == [tokenizer.decode([token]) for token in range(len(tokenizer))]


def test_the_token_view_is_the_default_page_of_a_language_models_file(files, tmp_path, capsys):
    _, codes, _, _ = files
    assert main(["view", str(codes), "--out", str(tmp_path / "page.html")]) == 0
    assert "token view" in capsys.readouterr().out
    text = (tmp_path / "page.html").read_text()
    assert 'id="token-data"' in text and "plotly" not in text.lower()
    assert main(["view", str(codes), "--view", "codes", "--out", str(tmp_path / "codes.html")]) == 0
    assert 'id="viewer-data"' in (tmp_path / "codes.html").read_text()


def test_the_server_answers_rows_as_the_compact_store_rebuilds_them_and_only_to_itself(files):
    _, codes, _, _ = files
    code_file = CodeFile(codes)
    server = RowServer(code_file)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        assert server.address == f"http://127.0.0.1:{server.port}/" and server.server_address[0] == "127.0.0.1"

        def get(path, **headers):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()

        host = f"127.0.0.1:{server.port}"
        status, body = get("/rows?example=1&layer=1&query=30", Host=host)
        assert status == 200
        expected = CodeFile(codes).compact.rows(1, [30], np.asarray([1]))[0, :, 0]
        np.testing.assert_array_equal(np.frombuffer(body, "<f4").reshape(expected.shape), expected)
        status, body = get("/overview?example=0&query=9", Host=f"localhost:{server.port}")
        rows = CodeFile(codes).compact.rows(0, [9], np.asarray([0]))[0, :, 0]
        assert status == 200 and [head[0] for head in json.loads(body)[0]] == rows.argmax(-1).tolist()
        assert get("/", Host=host)[0] == 200
        assert get("/", Host="evil.example")[0] == 403  # DNS rebinding: another name for this address
        assert get("/rows?example=0&layer=1&query=3", Host=host, Origin="http://evil.example")[0] == 403
        assert get("/rows?example=0&layer=1&query=3", Host=host, **{"Sec-Fetch-Site": "cross-site"})[0] == 403
        status, body = get("/rows?example=0&layer=7&query=3", Host=host)
        assert status == 400 and b"layer 7" in body
    finally:
        server.shutdown()
        server.server_close()


def test_ctrl_c_stops_the_server_with_one_line_and_status_0(files):
    _, codes, _, _ = files
    server = Served(codes)
    status, out, err = server.stop()
    assert status == 0 and out.splitlines() == [f"stopped serving {server.url}"] and err == ""


def test_ctrl_c_stops_the_server_while_a_browser_keeps_its_connection_open(files):
    _, codes, _, _ = files
    server = Served(codes)
    port = int(server.url.rsplit(":", 1)[1].strip("/"))
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # HTTP/1.1: kept open, as a tab does
    connection.request("GET", "/rows?example=0&layer=0&query=3", headers={"Host": f"127.0.0.1:{port}"})
    assert connection.getresponse().read()
    try:
        status, out, _ = server.stop()  # within its 30 s, the connection still open
        assert status == 0 and out.splitlines() == [f"stopped serving {server.url}"]
    finally:
        connection.close()


def test_serving_from_python_leaves_the_processs_allocator_alone(files, monkeypatch, capsys):
    """Only the command line gives the server one malloc arena (mallopt): serve_token_view called from
    Python loads no C library. `ready` raising KeyboardInterrupt stops it as a Ctrl-C would."""
    import ctypes

    from latentcode.analysis.viewer.serve import serve_token_view

    _, codes, _, _ = files
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: pytest.fail(f"loaded a C library: {args}"))

    def stop(address):
        raise KeyboardInterrupt

    assert serve_token_view(codes, ready=stop) == 0
    assert capsys.readouterr().out.startswith("stopped serving http://127.0.0.1:")


def test_serve_on_a_port_in_use_is_refused_in_one_line(files, capsys):
    _, codes, _, _ = files
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        assert main(["view", str(codes), "--serve", "--port", str(port)]) == 2
        line = one_line(capsys)
        assert f"--port {port}" in line and "not free" in line
    finally:
        taken.close()


def test_a_file_without_token_ids_is_refused_in_one_line(files, capsys):
    _, _, _, toy = files
    for flags in (["--serve"], ["--view", "tokens"]):
        assert main(["view", str(toy), *flags]) == 2
        assert "keeps no token ids" in one_line(capsys)


def test_serve_on_a_file_without_a_compact_store_is_refused_in_one_line(files, tmp_path, capsys):
    _, _, bare, _ = files
    assert main(["view", str(bare), "--serve"]) == 2
    assert "has no compact store" in one_line(capsys)
    # Without --serve the token view of its sites is a static page.
    assert main(["view", str(bare), "--view", "tokens", "--out", str(tmp_path / "bare.html")]) == 0


def test_a_static_page_embeds_rows_at_display_rounding_within_its_bounds(files):
    from latentcode.analysis.viewer.token_page import token_payload
    from latentcode.analysis.viewer.token_rows import TokenRows

    _, codes, _, _ = files
    code_file = CodeFile(codes)
    payload = token_payload(TokenRows(code_file), 1, "static", max_queries=6)
    embedded = payload["embedded"]
    assert embedded["queries"][:2] == [47, 46] and len(embedded["queries"]) == 6
    for name, heads in embedded["rows"].items():
        layer, query = map(int, name.split(":"))
        expected = code_file.compact.rows(layer, [query], np.asarray([1]))[0, :, 0]  # [H, T]
        decoded = np.zeros_like(expected)
        for head, (keys, codes_times_1000) in enumerate(heads):
            decoded[head, keys] = np.asarray(codes_times_1000) / 1000
        np.testing.assert_allclose(decoded, expected, atol=5e-4 + 1e-7, rtol=0)
    assert len(token_payload(TokenRows(code_file), 1, "static", max_bytes=1)["embedded"]["queries"]) == 1
