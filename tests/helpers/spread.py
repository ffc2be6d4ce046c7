"""Params far from init's 0.02, so every gradient is well above rounding noise."""
import numpy as np

from transformer_lab import named_params


def spread(params, seed=1, scale=0.3):
    """params in place (and returned): matrices and biases N(0, scale), gains 1 + N(0, scale)."""
    rng = np.random.default_rng(seed)
    for name, a in named_params(params):
        a[...] = (1.0 if name.endswith("weight") else 0.0) + scale * rng.normal(size=a.shape)
    return params
