"""`python -m helpers.pipeline.bisect --notebook 05 --claim ...`: the command line (cli.main)."""
import sys

from .cli import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before the bisect's own handlers were in place: nothing was installed or run
        print("interrupted before the bisect started", file=sys.stderr)
        sys.exit(130)
