"""`python -m kvresume serve MODEL [options]`: see kvresume.serve."""
import sys

from .serve import main

if __name__ == "__main__":
    sys.exit(main())
