"""``python -m raylite``: the raylite CLI (raylite.cli)."""
import sys

from raylite.cli import main

sys.exit(main())
