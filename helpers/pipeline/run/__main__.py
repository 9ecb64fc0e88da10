"""`python -m helpers.pipeline.run run-all | run NB | report | share | matrix`: the kit's command line (cli.main)."""
import sys

if __name__ == "__main__" and sys.argv[1:2] == ["_kernel"]:  # the kernel stub needs warm.py only
    from .warm import _kernel_main

    sys.exit(_kernel_main(sys.argv[2:]))

from .cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
