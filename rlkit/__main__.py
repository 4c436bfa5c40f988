"""``python -m rlkit`` (and ``torchrun --nproc_per_node N -m rlkit train …``): the CLI."""

import sys

from rlkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
