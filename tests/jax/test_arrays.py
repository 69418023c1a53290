"""Heap array constructors and queries (iris_jax.zeros/ones/.../to_heap, is_symmetric, heap_offset)."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.jax.helpers import use_runtime

WORLD = 4
SHAPE = (12, 5)
DTYPES = [jnp.float32, jnp.bfloat16, jnp.int32]
KEY = jax.random.key(7)


@pytest.fixture
def rt():
    return use_runtime(WORLD)


def placement(name):
    """Keyword arguments placing an array: sharding=... or device=..."""
    devs = jax.devices()
    if name == "sharded4":
        return {"sharding": NamedSharding(jax.make_mesh((4,), ("i",), devices=devs[:4]), P("i"))}
    if name == "sharded2":  # two devices that are not ranks 0 and 1
        return {"sharding": NamedSharding(jax.make_mesh((2,), ("i",), devices=devs[2:4]), P("i"))}
    if name == "replicated4":
        return {"sharding": NamedSharding(jax.make_mesh((4,), ("i",), devices=devs[:4]), P())}
    if name == "mesh2x2":  # sharded over j, replicated over i: every shard sits on two devices
        return {"sharding": NamedSharding(jax.make_mesh((2, 2), ("i", "j"), devices=devs[:4]), P("j"))}
    if name == "device":
        return {"device": devs[1]}
    raise ValueError(name)


PLACEMENTS = ["sharded4", "sharded2", "replicated4", "mesh2x2", "device"]


def ordinary(values, place):
    """`values` as an ordinary (non-heap) array with the placement."""
    return jax.device_put(values, place.get("sharding") or place["device"])


def expected_sharding(place):
    return place.get("sharding") or jax.sharding.SingleDeviceSharding(place["device"])


# name -> (iris constructor(dtype, place), reference(dtype) or None for uninitialized)
CONSTRUCTORS = {
    "zeros": (lambda dt, pl: iris_jax.zeros(SHAPE, dt, **pl), lambda dt: jnp.zeros(SHAPE, dt)),
    "ones": (lambda dt, pl: iris_jax.ones(SHAPE, dt, **pl), lambda dt: jnp.ones(SHAPE, dt)),
    "empty": (lambda dt, pl: iris_jax.empty(SHAPE, dt, **pl), None),
    "full": (lambda dt, pl: iris_jax.full(SHAPE, 7, dt, **pl), lambda dt: jnp.full(SHAPE, 7, dt)),
    "arange": (lambda dt, pl: iris_jax.arange(3, 51, 4, dtype=dt, **pl), lambda dt: jnp.arange(3, 51, 4, dtype=dt)),
    "zeros_like": (lambda dt, pl: iris_jax.zeros_like(ordinary(jnp.full(SHAPE, 5, dt), pl)),
                   lambda dt: jnp.zeros(SHAPE, dt)),
    "ones_like": (lambda dt, pl: iris_jax.ones_like(ordinary(jnp.full(SHAPE, 5, dt), pl)),
                  lambda dt: jnp.ones(SHAPE, dt)),
    "empty_like": (lambda dt, pl: iris_jax.empty_like(ordinary(jnp.full(SHAPE, 5, dt), pl)), None),
    "full_like": (lambda dt, pl: iris_jax.full_like(ordinary(jnp.zeros(SHAPE, dt), pl), -3),
                  lambda dt: jnp.full(SHAPE, -3, dt)),
    "rand": (lambda dt, pl: iris_jax.rand(KEY, SHAPE, dt, **pl), lambda dt: jax.random.uniform(KEY, SHAPE, dt)),
    "randn": (lambda dt, pl: iris_jax.randn(KEY, SHAPE, dt, **pl), lambda dt: jax.random.normal(KEY, SHAPE, dt)),
    "to_heap": (lambda dt, pl: iris_jax.to_heap(ordinary(jnp.arange(60, dtype=dt).reshape(SHAPE), pl)),
                lambda dt: jnp.arange(60, dtype=dt).reshape(SHAPE)),
}
FLOAT_ONLY = {"rand", "randn"}

CASES = [pytest.param(name, dt, pl, id=f"{name}-{jnp.dtype(dt).name}-{pl}")
         for name in CONSTRUCTORS for dt in DTYPES for pl in PLACEMENTS
         if not (name in FLOAT_ONLY and not jnp.issubdtype(dt, jnp.floating))]


def assert_symmetric_shards(rt, a, sharding):
    """Every device of `sharding` holds a shard of `a` on its heap, all at heap_offset(a)."""
    assert iris_jax.is_symmetric(a)
    offset = iris_jax.heap_offset(a)
    assert isinstance(offset, int) and offset >= 0
    shards = a.addressable_shards
    assert {s.device for s in shards} == set(sharding.addressable_devices)
    for s in shards:
        assert rt.heap.locate(s.data.unsafe_buffer_pointer()) == (rt.rank_of(s.device), offset), s.device
    return offset


@pytest.mark.parametrize("name,dtype,place_name", CASES)
def test_constructor(rt, name, dtype, place_name):
    make, reference = CONSTRUCTORS[name]
    place = placement(place_name)
    a = make(dtype, place)
    shape = (12,) if name == "arange" else SHAPE
    assert a.shape == shape
    assert a.dtype == jnp.dtype(dtype)
    assert a.sharding.is_equivalent_to(expected_sharding(place), a.ndim), a.sharding
    assert_symmetric_shards(rt, a, expected_sharding(place))
    if reference is not None:
        want = np.asarray(reference(dtype))
        np.testing.assert_array_equal(np.asarray(a), want)
        for s in a.addressable_shards:  # each shard holds its own part
            np.testing.assert_array_equal(np.asarray(s.data), want[s.index])


def test_like_constructors_take_dtype_and_sharding(rt):
    x = jnp.ones(SHAPE, jnp.float32)  # single device, not on the heap
    sharding = placement("sharded4")["sharding"]
    nines_like = lambda x, **kw: iris_jax.full_like(x, 9, **kw)
    for make, fill in [(iris_jax.zeros_like, 0), (iris_jax.ones_like, 1), (nines_like, 9)]:
        a = make(x, dtype=jnp.int32, sharding=sharding)
        assert a.dtype == jnp.int32 and a.sharding == sharding
        np.testing.assert_array_equal(np.asarray(a), np.full(SHAPE, fill, np.int32))
        assert_symmetric_shards(rt, a, sharding)
    e = iris_jax.empty_like(x, dtype=jnp.bfloat16, sharding=sharding)
    assert e.dtype == jnp.bfloat16 and e.shape == SHAPE and iris_jax.is_symmetric(e)


def test_default_placement_is_first_runtime_device(rt):
    a = iris_jax.zeros((5,), jnp.int32)
    assert a.devices() == {rt.devices[0]}
    assert iris_jax.is_symmetric(a)


@pytest.mark.parametrize("place_name", PLACEMENTS)
def test_to_heap_keeps_sharding(rt, place_name):
    place = placement(place_name)
    x = ordinary(jax.random.normal(KEY, SHAPE), place)
    assert not iris_jax.is_symmetric(x)
    h = iris_jax.to_heap(x)
    assert h.sharding == x.sharding
    np.testing.assert_array_equal(np.asarray(h), np.asarray(x))
    assert_symmetric_shards(rt, h, x.sharding)
    assert not iris_jax.is_symmetric(x)  # the source stays where it was


def test_to_heap_with_new_sharding_and_of_heap_array(rt):
    x = jnp.arange(24.0).reshape(12, 2)  # one device
    sharding = placement("sharded4")["sharding"]
    h = iris_jax.to_heap(x, sharding=sharding)
    assert h.sharding == sharding
    np.testing.assert_array_equal(np.asarray(h), np.asarray(x))
    h2 = iris_jax.to_heap(h)  # a copy: a new block of the heap
    assert iris_jax.heap_offset(h2) != iris_jax.heap_offset(h)
    np.testing.assert_array_equal(np.asarray(h2), np.asarray(x))
    h3 = iris_jax.to_heap(np.arange(6, dtype=np.int32))  # numpy input
    assert iris_jax.is_symmetric(h3) and h3.dtype == np.int32


def test_ordinary_arrays_are_not_symmetric(rt):
    sharding = placement("sharded4")["sharding"]
    h = iris_jax.ones(SHAPE, jnp.float32, sharding=sharding)
    for x in [jnp.ones(SHAPE), jax.device_put(jnp.ones(SHAPE), sharding), h + 1, jax.jit(lambda a: a * 2)(h),
              np.ones(SHAPE), 3.0, None]:
        assert not iris_jax.is_symmetric(x), type(x)
        assert iris_jax.heap_offset(x) is None
    assert iris_jax.is_symmetric(h)


def test_sharding_and_device_are_exclusive(rt):
    with pytest.raises(ValueError, match="sharding= or device="):
        iris_jax.zeros((4,), sharding=placement("sharded4")["sharding"], device=jax.devices()[0])


NAMED = {  # name -> the constructor, given a name=
    "zeros": lambda n: iris_jax.zeros(SHAPE, name=n), "ones": lambda n: iris_jax.ones(SHAPE, name=n),
    "empty": lambda n: iris_jax.empty(SHAPE, name=n), "full": lambda n: iris_jax.full(SHAPE, 7, name=n),
    "arange": lambda n: iris_jax.arange(12, name=n), "rand": lambda n: iris_jax.rand(KEY, SHAPE, name=n),
    "randn": lambda n: iris_jax.randn(KEY, SHAPE, name=n),
    "zeros_like": lambda n: iris_jax.zeros_like(jnp.ones(SHAPE), name=n),
    "ones_like": lambda n: iris_jax.ones_like(jnp.ones(SHAPE), name=n),
    "empty_like": lambda n: iris_jax.empty_like(jnp.ones(SHAPE), name=n),
    "full_like": lambda n: iris_jax.full_like(jnp.ones(SHAPE), 3, name=n),
    "to_heap": lambda n: iris_jax.to_heap(jnp.ones(SHAPE), name=n),
}


@pytest.mark.parametrize("constructor", sorted(NAMED))
def test_constructors_take_a_name(rt, constructor):
    """name= stays with the allocation (what the simulator's race reports call the array) and goes
    when the array does; a name that is not a str is refused before anything is allocated."""
    a = NAMED[constructor](f"my {constructor}")
    offset = iris_jax.heap_offset(a)
    assert rt.heap.allocation_names()[offset] == ("arrays", f"my {constructor}")
    del a
    gc.collect()
    assert offset not in rt.heap.allocation_names()
    before = rt.heap.used
    for bad in (7, b"flags", ""):
        with pytest.raises(TypeError, match="name must be a non-empty str"):
            NAMED[constructor](bad)
    assert rt.heap.used == before


def test_distinct_arrays_get_distinct_offsets(rt):
    arrays = [iris_jax.zeros((7,), jnp.float32, device=jax.devices()[0]) for _ in range(5)]
    assert len({iris_jax.heap_offset(a) for a in arrays}) == 5


def test_garbage_collection_returns_heap_memory(rt):
    sharding = placement("sharded4")["sharding"]
    gc.collect()
    start = rt.heap.used
    peak = start
    for i in range(10_000):
        if i % 2:
            a = iris_jax.zeros((3,), jnp.float32, device=jax.devices()[i % WORLD])
        else:
            a = iris_jax.full((8,), i, jnp.int32, sharding=sharding)
        peak = max(peak, rt.heap.used)
        del a
    gc.collect()
    assert rt.heap.used == start
    # memory returns as arrays die, not only when the heap runs out
    assert peak - start <= 4096, peak - start


def test_uncovered_device_raises_rank_mismatch(rt):
    devs = jax.devices()
    before = rt.heap.used
    with pytest.raises(iris_jax.RankMismatchError, match="has no iris heap"):
        iris_jax.zeros((4,), jnp.float32, device=devs[5])
    mesh = jax.make_mesh((4,), ("i",), devices=devs[2:6])  # ranks 2, 3 and two uncovered devices
    with pytest.raises(iris_jax.RankMismatchError, match="iris_jax.init"):
        iris_jax.ones((8,), jnp.float32, sharding=NamedSharding(mesh, P("i")))
    with pytest.raises(iris_jax.RankMismatchError):
        iris_jax.to_heap(jax.device_put(jnp.ones(3), devs[6]))
    assert rt.heap.used == before  # nothing was allocated


def test_heap_exhausted_raises_helpful_error():
    rt = use_runtime(2, heap_size=1 << 20)
    assert rt.heap_size == 1 << 20
    empty = rt.heap.used  # the status line (iris_core.heap.status) is never freed
    keep = iris_jax.zeros((1000,), jnp.float32, device=jax.devices()[0])
    used = rt.heap.used
    too_many = (1 << 20) // 4  # one MiB of float32: more than what is left
    with pytest.raises(iris_jax.HeapExhaustedError) as info:
        iris_jax.zeros((too_many,), jnp.float32, device=jax.devices()[0])
    message = str(info.value)
    assert "heap exhausted" in message
    assert "1.00 MiB" in message  # the heap size (and the request) in readable units
    assert "heap_size" in message and "IRIS_HEAP_SIZE" in message  # how to get a bigger heap
    assert isinstance(info.value, MemoryError) and isinstance(info.value, iris_jax.IrisError)
    assert rt.heap.used == used
    # what still fits can be allocated
    b = iris_jax.ones((too_many // 2,), jnp.float32, device=jax.devices()[1])
    assert iris_jax.is_symmetric(b) and float(b[-1]) == 1.0
    del keep, b
    gc.collect()
    assert rt.heap.used == empty
    iris_jax.shutdown()
