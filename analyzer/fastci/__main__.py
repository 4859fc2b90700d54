"""Allow ``python -m fastci``."""

from __future__ import annotations

import sys

from fastci.cli import main

sys.exit(main())
