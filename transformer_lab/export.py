"""`python -m transformer_lab.export`: the command itself lives in transformer_lab/cli/export.py."""
import sys

from .cli.export import main

if __name__ == "__main__":
    sys.exit(main())
