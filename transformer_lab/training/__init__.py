"""Training in NumPy: the hand-written backward pass, LoRA, AdamW, tasks and checkpoints."""
from .lora import LoRA

__all__ = ["LoRA"]
