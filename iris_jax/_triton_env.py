"""Import jax_triton without breaking plain Triton launches in this process.

jax_triton 0.3.1 sets TRITON_CACHE_DIR="" on import; any later ordinary Triton launch then
fails with "Could not create or locate cache dir". We put back the previous value (or
unset it, so Triton uses its default).
"""

import os


def import_jax_triton():
    before = os.environ.get("TRITON_CACHE_DIR")
    import jax_triton

    if before is None:
        if os.environ.get("TRITON_CACHE_DIR") == "":
            del os.environ["TRITON_CACHE_DIR"]
    else:
        os.environ["TRITON_CACHE_DIR"] = before
    return jax_triton
