"""Training in NumPy: the hand-written backward pass, LoRA, AdamW, the step and the tasks."""
from .lora import LoRA, LoRAGroup

__all__ = ["LoRA", "LoRAGroup"]
