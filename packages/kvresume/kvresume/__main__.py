"""`python -m kvresume serve MODEL [options]`: kvresume.serving.serve (needs the `serve` extra)."""
import sys


def run() -> int:
    from kvresume.serving.serve import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
