"""python -m transformer_lab.serve as a process, on a tiny GGUF file: the ready line, curl -N
streaming, SIGTERM and Ctrl-C (SIGINT) during a stream end it cleanly with exit 0 and no
traceback, and bad options, a missing model or a taken port give one line."""
import dataclasses
import json
import shutil
import signal
import socket
import subprocess
import sys

import pytest

pytest.importorskip("gguf")

from tiny_gguf import model_file, tiny_config, tiny_params, write_gguf  # noqa: E402,F401

from transformer_lab.cli.serve import build_parser, main  # noqa: E402

COMMAND = [sys.executable, "-m", "transformer_lab.serve"]


def start(path, *options):
    proc = subprocess.Popen(COMMAND + ["--model", str(path), "--port", "0", *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise AssertionError(f"no ready line: {line!r} {proc.stderr.read()!r}")
    url = line.split(" at ", 1)[1].split()[0]
    assert url.endswith("/v1") and url.startswith("http://127.0.0.1:")
    return proc, url[:-len("/v1")]


def stop(proc, sig):
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """The tiny model with a context of 4096: a stream of 4000 tokens takes seconds, so it
    is still going when the test signals the server right after its first chunk."""
    cfg = dataclasses.replace(tiny_config(tie=True), max_seq=4096)
    return write_gguf(tmp_path_factory.mktemp("gguf") / "long.gguf", cfg, tiny_params(cfg))


def open_stream(base, max_tokens=4000):
    """A stream that has sent its first chunk; (socket, file)."""
    port = int(base.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps({"prompt": [5, 6, 7], "stream": True, "max_tokens": max_tokens,
                       "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    f = sock.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    while not f.readline().startswith(b"data: "):
        pass
    return sock, f


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_stream_ends_the_stream_and_exits_0(long_model, sig):
    proc, base = start(long_model, "--max-num-seqs", "2")
    try:
        sock, f = open_stream(base)
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    code, out, err = stop(proc, sig)
    rest = f.read().decode()
    sock.close()
    assert code == 0, err
    assert "Traceback" not in err and "stopped" in err
    assert '"finish_reason": "abort"' in rest and "data: [DONE]" in rest


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_streams_and_api_key(model_file):
    path, _, _ = model_file
    proc, base = start(path, "--api-key", "k1")
    try:
        body = json.dumps({"prompt": "hello", "max_tokens": 5, "stream": True,
                           "temperature": 0})
        out = subprocess.run(["curl", "-sN", f"{base}/v1/completions", "-H",
                              "Content-Type: application/json", "-H", "Authorization: Bearer k1",
                              "-d", body], capture_output=True, text=True, timeout=60).stdout
        events = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) >= 2
        assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
        denied = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                 f"{base}/v1/models"], capture_output=True, text=True,
                                timeout=60).stdout
        assert denied == "401"
    finally:
        code, _, err = stop(proc, signal.SIGTERM)
    assert code == 0 and "Traceback" not in err
    assert "401 invalid_request_error" in err  # the one line the refusal logged


def test_bad_options_are_one_line_and_exit_2(capsys):
    for argv in (["--port", "70000"], ["--max-num-seqs", "0"], ["--batching", "sometimes"],
                 ["--num-blocks", "4", "--kv-cache-memory", "100"], ["--bogus"],
                 ["--served-model-name", ""], ["--speculative-config", "{ngram"],
                 ["--speculative-config", '{"method": "ngram"}'],
                 ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}']):
        with pytest.raises(SystemExit) as info:
            main(argv)
        out, err = capsys.readouterr()
        assert info.value.code == 2, argv
        assert out == "" and len(err.strip().splitlines()) == 1, err
        assert err.startswith("python -m transformer_lab.serve: error: ")


def test_missing_model_and_taken_port_are_one_line_and_exit_1(model_file, tmp_path, capsys):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["--model", str(tmp_path / "none.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: ") and "Traceback" not in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--model", str(model_file[0]), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"error: cannot listen on 127.0.0.1:{port}")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_the_loading_line_names_the_file_whose_stem_is_served(monkeypatch, capsys):
    from transformer_lab.pretrained.gguf import DEFAULT_GGUF
    from transformer_lab.cli import serve as cli

    def no_model(args):
        raise FileNotFoundError("not installed here")
    monkeypatch.setattr(cli, "load_engine", no_model)
    assert main([]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first == f"loading the default model ({DEFAULT_GGUF}) ..."
    assert DEFAULT_GGUF.endswith(".gguf")  # served as the stem, as /v1/models lists it


def test_a_fine_tunes_model_file_is_served_by_its_runs_name(tmp_path):
    from transformer_lab.cli.serve import served_name
    assert served_name(tmp_path / "runs" / "json" / "model.npz") == "json"
    assert served_name(tmp_path / "SmolLM2-135M-Instruct-Q4_1.gguf") == "SmolLM2-135M-Instruct-Q4_1"
    assert served_name(tmp_path / "mine.npz") == "mine"


def test_help_lists_the_options():
    text = build_parser().format_help()
    for option in ("--host", "--port", "--model", "--api-key", "--max-num-seqs", "--block-size",
                   "--num-blocks", "--max-waiting", "--max-body-bytes", "--batching",
                   "--speculative-config"):
        assert option in text
