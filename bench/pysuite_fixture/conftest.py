import os
import sys

# The suite's package sits next to its tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
