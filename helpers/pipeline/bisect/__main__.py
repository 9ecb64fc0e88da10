"""`python -m helpers.pipeline.bisect --notebook 05 --claim ...`: the command line (cli.main)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
