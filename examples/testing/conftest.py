# pytest-iris needs no conftest; this one only puts ring.py on the path, as an installed package would be
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
