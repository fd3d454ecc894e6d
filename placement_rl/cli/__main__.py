"""``python -m placement_rl.cli``: the same as the ``placement-rl`` command."""

from placement_rl.cli import main

raise SystemExit(main())
