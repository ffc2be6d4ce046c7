"""Training in NumPy: the hand-written backward pass, AdamW, tasks and checkpoints."""
