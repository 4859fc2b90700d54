"""Allow ``python -m fastci``."""

from __future__ import annotations

import sys

from fastci.cli.app import main

sys.exit(main())
