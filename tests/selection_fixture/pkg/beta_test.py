import sys

from pkg import beta

sys.exit(0 if beta.twice(2) == 4 else 1)
