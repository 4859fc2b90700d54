"""Entry point of every gpu_test: hands over to the launcher in ``fastci.run.launch``."""

from __future__ import annotations

import sys

from fastci.run.launch import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
