"""``python -m sdarflow.cli`` (and ``torchrun --module sdarflow.cli``, one process per GPU)."""

import sys

from sdarflow.cli import main

sys.exit(main())
