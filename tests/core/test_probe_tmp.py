import numpy as np
from iris_core.sim import get_world

def body(state):
    return state.rank

def test_probe():
    assert get_world(2).run(body) == [0, 1]
