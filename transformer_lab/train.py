"""`python -m transformer_lab.train`: the command itself lives in transformer_lab/cli/train.py."""
import sys

from .cli.train import main

if __name__ == "__main__":
    sys.exit(main())
