"""`@triton.autotune` and `@triton.heuristics`: one config, chosen without timing, on every platform.

jax-triton's GPU lowering compiles every config that survives pruning and has XLA time them on
the first run, on one device in isolation: ranks of a collective could pick different configs
(and pair up wrongly), and a kernel that waits on its peers cannot be timed alone. Under Triton's
interpreter timings mean nothing at all. So iris takes the first config that survives pruning:
the choice depends only on shapes, scalars and metaparameters, is made once per call site while
lowering, and is the same on every rank, on GPUs and on the simulator. Otherwise the semantics
are jax-triton's:

* a config that sets a metaparameter the caller passed with another value is dropped; then
  `prune_configs_by`'s early_config_prune(configs, named_args) and perf_model/top_k as Triton;
* a config adds its `kwargs` as constexprs; its num_warps / num_stages / num_ctas are compile
  options on GPUs (`ResolvedKernel.options`; the interpreter has no warps);
* heuristics see {**named_args, **metaparameters so far} and add their value; named_args maps
  each kernel parameter to its ShapedArray (arrays, outputs) or its value (scalars);
* a Config's pre_hook raises NotImplementedError, as on GPU. The autotuner's own pre_hook,
  post_hook and restore_value wrap Triton's benchmark runs: nothing is benchmarked here (jax-triton
  benchmarks without them), so they are not called.

Two things go beyond jax-triton 0.3.1's lowering: `reset_to_zero` zeroes the named outputs (or
inputs aliased to outputs) before the launch; heuristics over an autotuner resolve in Triton's
order (their values are then metaparameters of the autotuner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from triton.runtime.autotuner import Autotuner, Config, Heuristics
from triton.runtime.errors import AutotunerError

from iris_jax.calls.triton_call import kernel_arguments


@dataclasses.dataclass(frozen=True)
class ResolvedKernel:
    """An Autotuner/Heuristics chain reduced to what is launched."""

    kernel: object  # the @triton.jit function at the bottom of the chain
    constexprs: dict  # the caller's metaparameters, the chosen configs' kwargs, the heuristics' values
    reset_outputs: tuple[int, ...]  # outputs the autotuners' reset_to_zero asks to zero
    options: dict = dataclasses.field(default_factory=dict)  # the chosen configs' num_warps/stages/ctas


def resolve_kernel(
    kernel, args: Sequence, outputs: Sequence, metaparams: Mapping, aliases: Mapping[int, int]
) -> ResolvedKernel:
    """Peels autotuners and heuristics off `kernel`, choosing one config per autotuner.

    Args:
      kernel: a @triton.jit function, possibly wrapped in @triton.autotune / @triton.heuristics.
      args: the kernel's arguments before its outputs: ShapedArrays for arrays, values for scalars.
      outputs: the outputs' ShapedArrays (the kernel's last arguments).
      metaparams: the constexprs the caller passed.
      aliases: position in `args` of an input -> index of the output it is aliased to.
    """
    named_args = dict(zip(kernel.arg_names, [*args, *outputs]))
    constexprs = dict(metaparams)
    reset_names: list[str] = []
    options: dict = {}
    while isinstance(kernel, (Autotuner, Heuristics)):
        if isinstance(kernel, Autotuner):
            config = choose_config(kernel, named_args, constexprs)
            constexprs.update(config.kwargs)
            options = {k: getattr(config, k) for k in ("num_warps", "num_stages", "num_ctas")
                       if getattr(config, k, None) is not None}
            reset_names += kernel.reset_to_zero
        else:
            for name, heuristic in kernel.values.items():
                constexprs[name] = heuristic({**named_args, **constexprs})
        kernel = kernel.fn
    reset = tuple(sorted({_output_named(kernel, name, len(args), aliases) for name in reset_names}))
    return ResolvedKernel(kernel, constexprs, reset, options)


def resolve_call(kernel, arrays: Sequence, scalars: Sequence[tuple], outputs: Sequence, metaparams: Mapping,
                 aliases: Mapping[int, int]) -> ResolvedKernel:
    """resolve_kernel for one call: `arrays` (the array arguments before the outputs, in order)
    with `scalars` (position, value) at their positions; `aliases`: array index -> output index."""
    args = kernel_arguments(arrays, scalars, [])
    scalar_at = {p for p, _ in scalars}
    array_at = [p for p in range(len(args)) if p not in scalar_at]
    return resolve_kernel(kernel, args, outputs, metaparams, {array_at[i]: o for i, o in aliases.items()})


def choose_config(autotuner: Autotuner, named_args: Mapping, metaparams: Mapping) -> Config:
    """The first of the autotuner's configs that survives pruning (no benchmark: see the module)."""
    name = autotuner.base_fn.__name__
    if any(config.pre_hook is not None for config in autotuner.configs):
        raise NotImplementedError(
            f"`pre_hook` is not supported (kernel {name}; jax-triton's GPU lowering refuses it too): JAX "
            "outputs are fresh buffers; zero them with zeroed_outputs=... (a function of the metaparameters "
            "where it depends on the config) or the autotuner's reset_to_zero"
        )
    configs = [c for c in autotuner.configs if all(c.kwargs.get(k, v) == v for k, v in metaparams.items())]
    if not configs:
        raise AutotunerError(
            f"no config of kernel {name} agrees with the metaparameters passed to triton_call "
            f"({dict(metaparams)}); pass fewer of them, or add a config that sets them so"
        )
    if autotuner.early_config_prune:
        configs = autotuner.early_config_prune(configs, named_args)
        if not configs:
            raise AutotunerError(f"early_config_prune of kernel {name} left no config; it must keep at least one")
    return _predicted_fastest_first(autotuner, configs, named_args, metaparams)[0]


def _predicted_fastest_first(autotuner: Autotuner, configs: list, named_args: Mapping, metaparams: Mapping) -> list:
    """Triton's perf_model step: where more configs are left than top_k, the predicted fastest first."""
    if not autotuner.perf_model:
        return configs
    top_k = autotuner.configs_top_k
    if isinstance(top_k, float) and top_k <= 1.0:
        top_k = int(len(autotuner.configs) * top_k)
    if len(configs) <= top_k:
        return configs
    return sorted(configs, key=lambda c: autotuner.perf_model(**named_args, **metaparams, **c.all_kwargs()))


def _output_named(kernel, name: str, num_args: int, aliases: Mapping[int, int]) -> int:
    """The output that reset_to_zero's `name` refers to: itself, or the output an input is aliased to."""
    names = list(kernel.arg_names)
    if name not in names:
        raise ValueError(
            f"reset_to_zero names {name!r}, which is not a parameter of kernel "
            f"{kernel.fn.__name__} (its parameters: {', '.join(names)})"
        )
    position = names.index(name)
    if position >= num_args:
        return position - num_args
    if position in aliases:
        return aliases[position]
    raise ValueError(
        f"reset_to_zero names {name!r}, an input of kernel {kernel.fn.__name__}: JAX inputs are "
        "read-only; alias it to an output with input_output_aliases={input index: output index}, "
        "or make it an output"
    )
