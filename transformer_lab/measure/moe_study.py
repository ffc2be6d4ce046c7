"""A mixture of experts trained beside a dense model that costs a token the same.

moe_study(cfg, task) trains three models on the same batches, from the same seed:

- "moe": cfg with Switch's balance loss (balance_coef times each layer's E·Σ f_i·P_i);
- "moe_plain": cfg without it;
- "dense": dense_twin(cfg), whose MLP has as many weights as a token multiplies by in the
  MoE layer (the router, its k experts, the shared ones): the same FLOPs per token
  (measure/flops.py), E/k times fewer parameters in the MLPs.

and reports, each from the models it trained:

- the held-out cross-entropy against steps and against training FLOPs (the balance loss
  left out, so the three curves compare);
- the load over the experts on the held-out batch, and its coefficient of variation
  (expert_load.load_cv), with and without the balance loss;
- the share of the token choices a capacity factor drops (each expert keeps at most
  ceil(factor * N * k / E)), on both trained MoE models' routing;
- one held-out row's routing (its tokens, each one's chosen experts and weights).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..acts import ActivationRecord
from ..config import MOE_FIELDS, Config
from ..model import forward, loss
from ..moe import capacity
from ..params import init_params, named_params, param_shapes
from ..training.optim import AdamW, cosine_lr
from ..training.step import train_step
from ..validate import check_int, check_number
from .expert_load import dropped, expert_load, load_cv
from .flops import active_moe_weights, matmul_weights, train_step_flops

CAPACITY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
RUNS = ("moe", "moe_plain", "dense")


def dense_twin(cfg: Config) -> Config:
    """The dense config a token costs the same in as in cfg's MoE layers: every MoE field at
    its default, d_ff = round(active_moe_weights / 3d), so its SwiGLU's three [d, d_ff]
    matrices hold the router's, the k experts' and the shared experts' weights."""
    if not cfg.n_experts:
        raise ValueError("dense_twin: cfg is dense already (n_experts=0)")
    if cfg.first_dense_layers:
        raise ValueError(f"dense_twin: cfg's first {cfg.first_dense_layers} layers are dense "
                         f"at d_ff={cfg.d_ff}; a twin gives every layer one width, so give a "
                         f"config with first_dense_layers=0")
    defaults = {f.name: f.default for f in dataclasses.fields(Config) if f.name in MOE_FIELDS}
    d_ff = max(1, round(active_moe_weights(cfg) / (3 * cfg.d_model)))
    return cfg.replace(n_experts=0, d_ff=d_ff, **defaults)


def param_count(cfg: Config) -> int:
    """Every parameter of cfg's model."""
    return sum(int(np.prod(shape)) for _, shape in named_params(param_shapes(cfg)))


def active_params(cfg: Config) -> int:
    """The parameters a token goes through: all of them but, in each MoE layer, the E - k
    routed experts it did not choose (three [d, moe_d_ff] matrices each)."""
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    unused = cfg.n_experts - cfg.experts_per_token if cfg.n_experts else 0
    return param_count(cfg) - moe_layers * unused * 3 * cfg.d_model * cfg.expert_d_ff


def _record(params, cfg, tokens):
    acts = ActivationRecord()
    forward(params, cfg, tokens, acts=acts)
    return acts


def train_run(cfg: Config, task, *, steps, batch, seed, lr, held_out, eval_every):
    """Train cfg from init_params(seed) on task's batches (AdamW, warmup then cosine, clip 1):
    (params, {"train_loss": [per step], "curve": [{"step", "flops", "loss"}]}), the curve's
    loss the cross-entropy alone on the held-out batch, at step 0 and every eval_every."""
    params = init_params(cfg, seed=seed)
    opt = AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(seed)
    scoring = cfg.replace(balance_loss_coef=0.0) if cfg.n_experts else cfg
    per_step = train_step_flops(cfg, batch, task.seq)
    train_loss, curve = [], []

    def evaluate(step):
        curve.append({"step": step, "flops": step * per_step,
                      "loss": float(loss(params, scoring, *held_out))})
    evaluate(0)
    for step in range(steps):
        tokens, targets = task.batch(batch, rng)
        opt.lr = cosine_lr(step, max_lr=lr, warmup=max(1, steps // 10), total=steps,
                           min_lr=lr / 10)
        train_loss.append(float(train_step(params, cfg, opt, tokens, targets, clip=1.0)[0]))
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            evaluate(step + 1)
    return params, {"train_loss": train_loss, "curve": curve, "flops_per_step": per_step}


def moe_study(cfg: Config, task, *, steps=100, batch=16, seed=0, lr=3e-3, balance_coef=0.01,
              capacity_factors=CAPACITY_FACTORS, held_out_rows=64, eval_every=10) -> dict:
    """The three runs and what they show (see the module's docstring); plain numbers only."""
    steps = check_int(steps, "moe_study: steps", low=1)
    batch = check_int(batch, "moe_study: batch", low=1)
    eval_every = check_int(eval_every, "moe_study: eval_every", low=1)
    balance_coef = check_number(balance_coef, "moe_study: balance_coef", low=0, low_open=True)
    for f in capacity_factors:
        check_number(f, "moe_study: capacity factor", low=0, low_open=True)
    dense = dense_twin(cfg)  # checks cfg is a mixture of experts
    held_out = task.batch(check_int(held_out_rows, "moe_study: held_out_rows", low=1),
                          np.random.default_rng(seed + 104729))  # not the training stream
    configs = {"moe": cfg.replace(balance_loss_coef=balance_coef, capacity_factor=None),
               "moe_plain": cfg.replace(balance_loss_coef=0.0, capacity_factor=None),
               "dense": dense}
    runs, trained = {}, {}
    for name, run_cfg in configs.items():
        trained[name], runs[name] = train_run(run_cfg, task, steps=steps, batch=batch, seed=seed,
                                              lr=lr, held_out=held_out, eval_every=eval_every)
        runs[name].update(params=param_count(run_cfg), active=matmul_weights(run_cfg))
        if run_cfg.n_experts:
            acts = _record(trained[name], run_cfg, held_out[0])
            runs[name]["load"] = {i: v.tolist() for i, v in expert_load(acts, run_cfg).items()}
            runs[name]["cv"] = load_cv(acts, run_cfg)
    n_tokens = held_out[0].size
    drops = []
    for factor in capacity_factors:
        row = {"factor": float(factor),
               "capacity": capacity(n_tokens, cfg.replace(capacity_factor=factor))}
        for name in ("moe", "moe_plain"):
            limited = configs[name].replace(capacity_factor=factor)
            lost = dropped(_record(trained[name], limited, held_out[0]), limited)
            row[name] = sum(lost.values()) / (len(lost) * n_tokens * cfg.experts_per_token)
        drops.append(row)
    return {"steps": steps, "batch": batch, "seq": task.seq, "balance_coef": balance_coef,
            "experts": cfg.n_experts, "k": cfg.experts_per_token, "moe_d_ff": cfg.expert_d_ff,
            "dense_d_ff": dense.d_ff, "held_out_tokens": n_tokens, "runs": runs,
            "capacity": drops, "routing": routing_table(trained["moe"], configs["moe"],
                                                        held_out[0][:1])}


def routing_table(params, cfg: Config, tokens) -> dict:
    """One row's routing in each MoE layer: {"tokens": [T], "layers": {i: {"experts": [T][k],
    "weights": [T][k]}}}."""
    acts = _record(params, cfg, tokens)
    return {"tokens": tokens[0].tolist(),
            "layers": {i: {"experts": acts.layer(i, "moe.experts")[0].tolist(),
                           "weights": acts.layer(i, "moe.weights")[0].tolist()}
                       for i in range(cfg.n_layers) if cfg.is_moe_layer(i)}}
