"""model.npz: a model that runs alone (weights, config, tokenizer), in LLM, chat and serve;
adapter.npz; and the errors for files that are not ours or lack a tokenizer."""
import numpy as np
import pytest

from tiny_model import tiny_tokenizer, write_tiny_model
from transformer_lab import save_checkpoint
from transformer_lab.params import PackedGroup, named_params
from transformer_lab.pretrained.tokenizer import BPETokenizer
from transformer_lab.pretrained.model_file import (load_adapters, load_model, save_adapters,
                                                 save_model)

TEXT = "<|im_start|>user\nthe hammer, 7 数字 🙂<|im_end|>"


def test_the_tokenizer_rebuilds_from_plain_data():
    tok = tiny_tokenizer()
    again = BPETokenizer.from_dict(tok.to_dict())
    assert again.encode(TEXT) == tok.encode(TEXT) and again.decode(tok.encode(TEXT)) == TEXT
    assert (again.tokens, again.token_types, again.pre, again.bos_id, again.eos_id) == \
        (tok.tokens, tok.token_types, tok.pre, tok.bos_id, tok.eos_id)
    with pytest.raises(ValueError, match="lacks merges"):
        BPETokenizer.from_dict({"tokens": ["a"], "token_types": [1], "pre": "gpt2"})


def test_a_model_file_round_trips(tmp_path):
    cfg, params, tok = write_tiny_model(tmp_path / "model.npz")
    cfg2, params2, tok2 = load_model(tmp_path / "model.npz")
    assert cfg2 == cfg and tok2.encode(TEXT) == tok.encode(TEXT)
    assert isinstance(params2["blocks"][0]["attn"], PackedGroup)  # packed, as load_gguf's
    for (name, a), (_, b) in zip(named_params(params), named_params(params2)):
        assert np.array_equal(a, b), name
    cfg64, params64, _ = load_model(tmp_path / "model.npz", dtype=np.float64)
    assert cfg64.dtype == np.float64 and params64["tok_emb"].dtype == np.float64


def test_llm_chat_and_serve_run_a_model_file_alone(tmp_path, capsys):
    from transformer_lab.cli import chat
    from transformer_lab.cli import serve as serve_main
    from transformer_lab.serve.llm import LLM
    from transformer_lab.serve.sampling_params import SamplingParams
    path = tmp_path / "model.npz"
    cfg, params, tok = write_tiny_model(path)
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    got = LLM(str(path)).generate(["the hammer"], greedy, use_tqdm=False)[0]
    want = LLM.from_params(cfg, params, tok).generate(["the hammer"], greedy, use_tqdm=False)[0]
    assert got.token_ids == want.token_ids and got.text == want.text
    assert chat.main(["--model", str(path), "--greedy", "--max-new-tokens", "3", "hi"]) == 0
    assert capsys.readouterr().out.strip() != ""
    args = serve_main.build_parser().parse_args(["--model", str(path)])
    llm, name = serve_main.load_engine(args)
    assert name == path.parent.name and llm.cfg == cfg  # runs/DIR/model.npz is served as DIR


def test_a_checkpoint_without_a_tokenizer_is_refused(tmp_path):
    cfg, params, _ = write_tiny_model(tmp_path / "model.npz")
    save_checkpoint(tmp_path / "checkpoint.npz", params, cfg, step=3)
    with pytest.raises(ValueError, match="checkpoint.npz is a transformer_lab checkpoint "
                                         "without a tokenizer"):
        load_model(tmp_path / "checkpoint.npz")


@pytest.mark.parametrize("content,needle", [
    (b"hello, not a model", "neither a GGUF file nor a transformer_lab model.npz"),
    (b"", "neither a GGUF file"),
    (b"PK\x03\x04 broken zip", "not a readable transformer_lab checkpoint"),
])
def test_a_file_that_is_not_ours_is_refused(tmp_path, content, needle):
    path = tmp_path / "x.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=needle):
        load_model(path)


def test_an_interrupted_write_is_refused_and_leaves_the_old_file(tmp_path):
    path = tmp_path / "model.npz"
    write_tiny_model(path)
    whole = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[:len(whole) // 2])  # a write cut short
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_model(tmp_path / "cut.npz")
    cfg, params, tok = load_model(path)

    class Stop(BaseException):
        pass

    def interrupted(*a, **k):
        raise Stop  # Ctrl-C in the middle of np.savez
    real = np.savez
    np.savez = interrupted
    try:
        with pytest.raises(Stop):
            save_model(path, params, cfg, tok)
    finally:
        np.savez = real
    assert path.read_bytes() == whole and sorted(p.name for p in tmp_path.iterdir()) == \
        ["cut.npz", "model.npz"]  # no temporary file left behind


def test_adapters_round_trip(tmp_path):
    cfg, _, _ = write_tiny_model(tmp_path / "model.npz")
    rng = np.random.default_rng(0)
    adapters = {"blocks": [{"attn": {"wq": {"A": rng.normal(size=(32, 2)).astype(np.float32),
                                            "B": np.zeros((2, 32), np.float32)}}}
                           for _ in range(cfg.n_layers)]}
    save_adapters(tmp_path / "adapter.npz", adapters, cfg, rank=2, alpha=4, targets=("wq",))
    cfg2, got, options = load_adapters(tmp_path / "adapter.npz")
    assert cfg2 == cfg and options == {"rank": 2, "alpha": 4.0, "targets": ["wq"]}
    assert np.array_equal(got["blocks"][1]["attn"]["wq"]["A"], adapters["blocks"][1]["attn"]["wq"]["A"])
    with pytest.raises(ValueError, match="not a transformer_lab adapters file"):
        load_adapters(tmp_path / "model.npz")
