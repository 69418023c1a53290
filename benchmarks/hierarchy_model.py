"""Hierarchical vs flat all-reduce beyond one NVLink domain: a cost model on paper.

    python benchmarks/hierarchy_model.py [--ib-gbps 400] [--efficiency 0.9] [--plot out.png]

No multi-node machine was available: this combines measured intra-domain times with a
textbook model of the inter-domain network. Assumptions:

* A domain is the measured node: 2 x H200 over NVLink (NV18). Intra-domain times are iris's
  psum, psum_scatter and all_gather per call on it, float32 (the collectives tables of
  benchmarks/RESULTS.md; benchmarks/out/collectives.json), interpolated log-log between the measured sizes
  (1 KiB .. 1 GiB per GPU). Their flat baseline at one domain is lax.psum from the same run.
* Across domains every GPU has its own NIC ("rail"): InfiniBand NDR, 400 Gb/s = 50 GB/s per
  direction, of which `efficiency` (0.9) is reached; a message step costs `alpha` (3 us:
  wire, switch and NIC latency plus the proxy's work) and every XLA collective a fixed
  `floor` (20 us, what XLA's own psum costs per call on the 2 x H200 machine however small:
  DESIGN.md's baselines).
* XLA's all-reduce over P ranks is a ring: floor + 2 (P - 1) alpha + 2 (P - 1) / P x bytes /
  bandwidth. The flat all-reduce over every GPU of N domains is that ring over P = 2N ranks,
  bound by the NIC (the slowest link of the ring). NCCL's tree, CollNet and NVLink-SHARP
  algorithms are not modelled (they lower the latency term of the flat ring at scale).
* Hierarchical, as iris_jax.collectives.domains composes a psum over ("node", "gpu"):
  - "psum/psum": iris psum inside the domain, then XLA psum across N domains on all the
    bytes (each GPU in its rail: G rings in parallel, one per NIC);
  - "scatter": iris psum_scatter inside, XLA psum across on 1/G of the bytes, iris
    all_gather inside (the bandwidth-optimal composition).
  Intra- and inter-domain steps do not overlap (they run one after another, as composed).

Prints one table per number of domains (times per call in us, the speedup of the better
hierarchical composition over flat) and the smallest size from which "scatter" beats
"psum/psum" (iris_jax.CollectiveConfig.scatter_hierarchy_from, default 1 MiB). With
matplotlib, `--plot` writes the times over message size for each number of domains.
"""

from __future__ import annotations

import argparse
import math

G = 2  # GPUs per domain in the measurements
KIB = 1024
# bytes per GPU -> us per call, 2 x H200, float32 (benchmarks/RESULTS.md's collectives tables)
MEASURED_SIZES = [KIB << k for k in range(0, 21, 2)]  # 1 KiB, 4 KiB, ..., 1 GiB
IRIS_PSUM = [5.68, 5.99, 6.36, 7.43, 7.77, 10.96, 21.13, 63.22, 228.47, 894.12, 3502.66]
IRIS_PSUM_SCATTER = [5.80, 5.89, 6.20, 7.75, 7.70, 9.47, 16.19, 39.20, 135.11, 524.49, 2009.83]
IRIS_ALL_GATHER = [6.00, 6.14, 6.75, 8.30, 8.56, 11.67, 21.99, 66.60, 230.50, 907.69, 3502.94]  # input bytes
LAX_PSUM = [37.38, 35.31, 30.42, 33.95, 30.07, 23.42, 28.26, 81.11, 284.49, 1022.18, 3752.07]


def measured(table: list[float], nbytes: float) -> float:
    """Log-log interpolation of a measured table (linear in bytes past its ends)."""
    sizes = MEASURED_SIZES
    if nbytes <= sizes[0]:
        return table[0]
    if nbytes >= sizes[-1]:
        return table[-1] * nbytes / sizes[-1]
    k = max(i for i in range(len(sizes)) if sizes[i] <= nbytes)
    t = math.log(nbytes / sizes[k]) / math.log(sizes[k + 1] / sizes[k])
    return math.exp((1 - t) * math.log(table[k]) + t * math.log(table[k + 1]))


def ring_all_reduce_us(ranks: int, nbytes: float, net) -> float:
    """XLA's ring all-reduce across `ranks` ranks of the inter-domain network."""
    if ranks == 1:
        return 0.0
    return net.floor_us + 2 * (ranks - 1) * net.alpha_us + 2 * (ranks - 1) / ranks * nbytes / net.bytes_per_us


def flat_us(domains: int, nbytes: float, net) -> float:
    if domains == 1:
        return measured(LAX_PSUM, nbytes)
    return ring_all_reduce_us(G * domains, nbytes, net)


def psum_psum_us(domains: int, nbytes: float, net) -> float:
    return measured(IRIS_PSUM, nbytes) + ring_all_reduce_us(domains, nbytes, net)


def scatter_us(domains: int, nbytes: float, net) -> float:
    share = nbytes / G
    return (measured(IRIS_PSUM_SCATTER, nbytes) + ring_all_reduce_us(domains, share, net)
            + measured(IRIS_ALL_GATHER, share))


class Network:
    def __init__(self, gbps: float, efficiency: float, alpha_us: float, floor_us: float):
        self.bytes_per_us = gbps / 8 * 1e3 * efficiency  # Gb/s -> bytes per us
        self.alpha_us, self.floor_us = alpha_us, floor_us


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def table(domains: int, net, sizes) -> list[str]:
    lines = [f"### {domains} domain{'s' if domains > 1 else ''} of {G} GPUs ({G * domains} GPUs)", "",
             "| bytes/GPU | flat (us) | psum/psum (us) | scatter (us) | best hierarchical vs flat |",
             "|---|---|---|---|---|"]
    for n in sizes:
        f, a, s = flat_us(domains, n, net), psum_psum_us(domains, n, net), scatter_us(domains, n, net)
        if domains == 1:  # nothing crosses a domain: one iris psum (scatter is not composed)
            lines.append(f"| {_size(n)} | {f:.1f} | {a:.1f} | - | {f / a:.2f}x |")
            continue
        lines.append(f"| {_size(n)} | {f:.1f} | {a:.1f} | {s:.1f} | {f / min(a, s):.2f}x |")
    return lines


def crossover(domains: int, net) -> int | None:
    """The smallest power-of-two size from which "scatter" beats "psum/psum"."""
    for k in range(10, 31):
        if scatter_us(domains, 1 << k, net) < psum_psum_us(domains, 1 << k, net):
            return 1 << k
    return None


def plot(path: str, domain_counts, net) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = [1 << k for k in range(10, 31)]
    fig, ax = plt.subplots(figsize=(8, 5))
    for domains, color in zip(domain_counts, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        ax.plot(sizes, [flat_us(domains, n, net) for n in sizes], "--", color=color, label=f"flat, {domains} dom.")
        ax.plot(sizes, [min(psum_psum_us(domains, n, net), scatter_us(domains, n, net)) for n in sizes], "-",
                color=color, label=f"hierarchical, {domains} dom.")
    ax.set(xscale="log", yscale="log", xlabel="bytes per GPU", ylabel="us per all-reduce",
           title=f"all-reduce over N domains of {G} x H200 (model; NDR {net.bytes_per_us / 1e3:.0f} GB/s per GPU)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ib-gbps", type=float, default=400.0, help="NIC link rate per GPU, Gb/s per direction")
    parser.add_argument("--efficiency", type=float, default=0.9, help="share of the link rate reached")
    parser.add_argument("--alpha-us", type=float, default=3.0, help="latency of one inter-domain ring step")
    parser.add_argument("--floor-us", type=float, default=20.0, help="fixed cost of one XLA collective")
    parser.add_argument("--domains", default="1,2,4,8,32", help="numbers of domains (comma-separated)")
    parser.add_argument("--plot", default="", help="write the plot here (needs matplotlib)")
    parser.add_argument("--small", action="store_true", help="a tiny run (CI runs it): 1 and 2 domains, no plot")
    args = parser.parse_args()
    if args.small:
        args.domains, args.plot = "1,2", ""
    net = Network(args.ib_gbps, args.efficiency, args.alpha_us, args.floor_us)
    domain_counts = [int(d) for d in args.domains.split(",")]
    sizes = [KIB << k for k in range(0, 21, 2)]
    for domains in domain_counts:
        print("\n".join(table(domains, net, sizes)), end="\n\n")
    for domains in domain_counts[1:] if domain_counts[0] == 1 else domain_counts:
        at = crossover(domains, net)
        print(f"{domains} domains: scatter beats psum/psum from {_size(at) if at else 'never (<= 1 GiB)'}")
    if args.plot:
        print(f"plot: {args.plot}" if plot(args.plot, domain_counts, net) else "plot: matplotlib not installed")


if __name__ == "__main__":
    main()
