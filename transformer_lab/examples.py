"""The course's week-8 worked example: a 1-layer model with hand-set teaching weights.

Small enough to follow with pencil and paper: 5 words, d = 4, 2 heads of
size 2, identity attention projections, and an MLP that passes a quarter of
its GELU through. Lecture scripts and demo 07 trace it through forward().
"""
from __future__ import annotations

import numpy as np

from .config import Config, gpt2_config

WEEK8_VOCAB = ("我", "喜欢", "AI", "学习", "猫")
WEEK8_VOCAB_EN = ("I", "like", "AI", "learning", "cat")
WEEK8_PROMPTS = {"A": (0, 1), "B": (4, 1)}  # [我, 喜欢] and [猫, 喜欢]

WEEK8_CONFIG = gpt2_config(vocab=5, d_model=4, n_heads=2, n_layers=1, d_ff=16, max_seq=2,
                           mlp="gelu", norm_eps=1e-5, tie_embeddings=False, dtype=np.float64)


def week8_params(cfg: Config = WEEK8_CONFIG) -> dict:
    """The teaching weights in the standard params layout."""
    d, F = cfg.d_model, cfg.d_ff
    eye = np.eye(d)
    w_up = np.zeros((d, F))
    w_up[:, :d] = eye  # copy the 4 channels into the first 4 hidden units
    w_down = np.zeros((F, d))
    w_down[:d, :] = 0.25 * eye  # and take those units back, times 0.25

    def layer_norm_params():
        return {"weight": np.ones(d), "bias": np.zeros(d)}

    return {
        "tok_emb": np.array([[0.20, -0.10, 0.70, 0.30],
                             [0.60, 0.30, -0.20, 0.10],
                             [-0.40, 0.80, 0.50, -0.30],
                             [0.10, 0.20, 0.90, 0.40],
                             [-0.70, 0.40, 0.30, 0.60]]),
        "pos_emb": np.array([[0.05, 0.10, -0.05, 0.00],
                             [-0.10, 0.00, 0.05, 0.10]]),
        "blocks": [{
            "attn_norm": layer_norm_params(),
            "attn": {"wq": eye.copy(), "wk": eye.copy(), "wv": eye.copy(), "wo": eye.copy(),
                     "bq": np.zeros(d), "bk": np.zeros(d), "bv": np.zeros(d), "bo": np.zeros(d)},
            "mlp_norm": layer_norm_params(),
            "mlp": {"w_up": w_up, "w_down": w_down, "b_up": np.zeros(F), "b_down": np.zeros(d)},
        }],
        "final_norm": layer_norm_params(),
        "lm_head": {
            # Rows are tokens in the lecture's notation; the layout wants [d, vocab].
            "w": np.array([[1, 0, 0, 0],
                           [0, 1, 2, 2],
                           [0, 0, 1, 1],
                           [0, 3, -1, 0],
                           [1, 2, 0, 0]], dtype=np.float64).T,
            "b": np.array([-0.2, 0.1, 0.0, 0.0, 0.0]),
        },
    }


def week8_example():
    """(cfg, params, vocab) of the worked example."""
    return WEEK8_CONFIG, week8_params(), WEEK8_VOCAB
