"""transformer_lab: a small, readable, pure-NumPy transformer for teaching and measuring."""
# the lecture core: config, ops, positions, precision, attention, caches, model, generation
from .config import TINY, TINY_GPT2, Config, gpt2_config, llama_config
from .ops import (cross_entropy, cross_entropy_backward, erf, gelu, gelu_backward, gelu_tanh,
                  gelu_tanh_backward, layer_norm, layer_norm_backward, log_softmax, rms_norm,
                  rms_norm_backward, silu, silu_backward, softmax)
from .positions import apply_rope, apply_rope_backward, rope_angles, sinusoidal_pe
from .precision import DynamicLossScaler, format_info, round_to
from .attention import (attention_core, attention_core_backward, attention_reference,
                        attention_weights, causal_mask)
from .flash import (flash_attention, flash_attention_backward, flash_blocks, flash_io, flash_tiles,
                    merge_attention)
from .params import (PackedGroup, check_params, init_params, map_params, named_params,
                     pack_weights, param_shapes)
from .acts import ActivationRecord
from .cache import CacheProtocol, KVCache, MLAKVCache
from .streaming_cache import StreamingCache, StreamingCacheReference
from .mla import mla_attention, mla_attention_absorbed, mla_attention_naive
from .moe import moe_forward, moe_reference, route
from .model import check_tokens, forward, loss
from .generation import generate, generate_stream, sample_next
# pretrained: GGUF files, the tokenizer, the .npz model file
from .pretrained.gguf import find_model, load_gguf
from .pretrained.gguf_write import save_gguf
from .pretrained.hf import load_hf
from .pretrained.tokenizer import BPETokenizer
from .pretrained.model_file import load_checkpoint, save_checkpoint
# training: the backward, LoRA, the optimiser, the one step, the tasks
from .training.backward import loss_and_grads
from .training.lora import LoRA
from .training.optim import AdamW, clip_grad_norm, cosine_lr
from .training.step import train_step
from .training.tasks import TASKS, Task, get_task
# measure: weight quantization (round to nearest, AWQ) of a whole model
from .measure.weight_quant import awq_scales, fake_quant, quantize_model

__version__ = "0.1.0"

__all__ = [
    "Config", "TINY", "TINY_GPT2", "gpt2_config", "llama_config",
    "init_params", "param_shapes", "named_params", "map_params", "check_params", "check_tokens",
    "pack_weights", "PackedGroup",
    "forward", "loss", "ActivationRecord",
    "generate", "generate_stream", "sample_next", "KVCache", "MLAKVCache", "StreamingCache",
    "StreamingCacheReference", "CacheProtocol", "loss_and_grads",
    "attention_core", "attention_reference", "attention_weights", "causal_mask",
    "flash_attention", "flash_attention_backward", "merge_attention", "flash_io", "flash_tiles",
    "flash_blocks",
    "mla_attention", "mla_attention_naive", "mla_attention_absorbed",
    "moe_forward", "moe_reference", "route",
    "softmax", "log_softmax", "layer_norm", "rms_norm", "erf", "gelu", "gelu_tanh", "silu",
    "sinusoidal_pe", "rope_angles", "apply_rope", "cross_entropy",
    "layer_norm_backward", "rms_norm_backward", "gelu_backward", "gelu_tanh_backward", "silu_backward",
    "apply_rope_backward", "attention_core_backward", "cross_entropy_backward",
    "load_gguf", "save_gguf", "load_hf", "find_model", "BPETokenizer", "quantize_model", "fake_quant", "awq_scales",
    "AdamW", "LoRA", "clip_grad_norm", "cosine_lr", "train_step", "save_checkpoint", "load_checkpoint",
    "TASKS", "Task", "get_task",
    "round_to", "format_info", "DynamicLossScaler",
]
