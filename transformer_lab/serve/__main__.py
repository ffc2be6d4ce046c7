"""`python -m transformer_lab.serve`: the command itself lives in transformer_lab/cli/serve.py."""
import sys

from ..cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
