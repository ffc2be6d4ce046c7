"""python -m transformer_lab.serve --tensor-parallel-size 2 as a process, on a tiny GGUF file:
the ready line names the ranks, a chat completion answers as one rank's engine does (its
worker started under mpiexec, bounded in time), SIGTERM ends it and its worker, exit 0;
a size the heads cannot take is one line, exit 1, and a size below 1 exit 2."""
import json
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

pytest.importorskip("gguf")

from tiny_gguf import model_file  # noqa: E402,F401

from transformer_lab.cli.serve import main  # noqa: E402
from transformer_lab.parallel.launch import missing_mpi  # noqa: E402
from transformer_lab.serve import LLM, SamplingParams  # noqa: E402

COMMAND = [sys.executable, "-m", "transformer_lab.serve"]
CHAT = [{"role": "user", "content": "Hi!"}]


def ready_line(proc, timeout=120):
    """The server's first stdout line, or a failure at the timeout (never a hang)."""
    got = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got:
        proc.kill()
        pytest.fail(f"no ready line within {timeout} s")
    return got[0]


def test_a_chat_completion_over_two_ranks(model_file):
    if missing_mpi():
        pytest.skip(missing_mpi())
    path = model_file[0]
    want = LLM(path).chat(CHAT, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                          use_tqdm=False)[0].text
    proc = subprocess.Popen(COMMAND + ["--model", str(path), "--port", "0",
                                       "--tensor-parallel-size", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ready_line(proc)
        assert line.startswith("serving ") and "tensor parallel over 2 ranks" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        body = json.dumps({"messages": CHAT, "max_tokens": 6, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/chat/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as response:
            answer = json.loads(response.read())
        assert answer["choices"][0]["message"]["content"] == want
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_sizes(model_file, capsys):
    path = str(model_file[0])
    assert main(["--model", path, "--tensor-parallel-size", "5"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == ("error: LLM: tensor_parallel_size=5 is more than the model's 4 query "
                       "heads: a rank would hold none")
    with pytest.raises(SystemExit) as exit_:
        main(["--model", path, "--tensor-parallel-size", "0"])
    assert exit_.value.code == 2
    assert "--tensor-parallel-size" in capsys.readouterr().err
