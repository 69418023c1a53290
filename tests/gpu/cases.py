"""The collectives that the GPU tests compare with lax, shared by both GPU execution models."""


def collective_cases(n: int, W: int):
    """(name, iris fn, lax fn, out spec) for every collective but all_reduce's variants, on a
    per-device vector of n values over mesh axis "i" of size W."""
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    perm = [(i, (i + 1) % W) for i in range(W)]
    even = n // W * W  # the split collectives need a multiple of W
    return [
        ("pmax", lambda v: iris_jax.pmax(v, "i"), lambda v: lax.pmax(v, "i"), P()),
        ("pmin", lambda v: iris_jax.pmin(v, "i"), lambda v: lax.pmin(v, "i"), P()),
        ("all_gather", lambda v: iris_jax.all_gather(v, "i"), lambda v: lax.all_gather(v, "i"), P("i")),
        ("psum_scatter", lambda v: iris_jax.psum_scatter(v[:even], "i", tiled=True),
         lambda v: lax.psum_scatter(v[:even], "i", tiled=True), P("i")),
        ("all_to_all", lambda v: iris_jax.all_to_all(v[:even], "i", 0, 0, tiled=True),
         lambda v: lax.all_to_all(v[:even], "i", 0, 0, tiled=True), P("i")),
        ("ppermute", lambda v: iris_jax.ppermute(v, "i", perm), lambda v: lax.ppermute(v, "i", perm), P("i")),
        ("broadcast", lambda v: iris_jax.broadcast(v, "i", 1),  # lax.pbroadcast's type: varying
         lambda v: lax.psum(v * (lax.axis_index("i") == 1).astype(v.dtype), "i"), P("i")),
    ]


def numpy_reference(name: str, xs, r: int):
    """What rank r of collective_cases' `name` holds, from every rank's input xs (W x n numpy)."""
    import numpy as np

    W, n = xs.shape
    even = n // W * W
    block = even // W
    if name == "pmax":
        return xs.max(0)
    if name == "pmin":
        return xs.min(0)
    if name == "all_gather":
        return xs.copy()
    if name == "psum_scatter":
        return xs[:, r * block:(r + 1) * block].sum(0)
    if name == "all_to_all":
        return np.concatenate([xs[j, r * block:(r + 1) * block] for j in range(W)])
    if name == "ppermute":
        return xs[(r - 1) % W]
    if name == "broadcast":
        return xs[1]
    raise ValueError(f"no numpy reference for {name!r}")
