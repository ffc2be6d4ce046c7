"""`python -m transformer_lab.chat`: the command itself lives in transformer_lab/cli/chat.py."""
import sys

from .cli.chat import main

if __name__ == "__main__":
    sys.exit(main())
