"""`python -m helpers.pipeline.run run-all | run NB | report | html | matrix`: the kit's command line (cli.main)."""
import sys

from .cli import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before the run's own handlers were in place: nothing had started
        print("interrupted before the run started", file=sys.stderr)
        sys.exit(130)
