import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                        # reference.py
sys.path.insert(0, os.path.dirname(HERE))       # the fiattn package of this checkout
ROOT = os.path.dirname(os.path.dirname(HERE))
