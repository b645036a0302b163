"""The ``polygrad`` command line.

    polygrad backends [--json]                 table of discovered backends
    polygrad demo moons [--plot FILE.png] [--json] ...
    polygrad demo gcn [--data DIR | --download] [--dataset cora] [--backend NAME] [--epochs N]
                      [--seed S] [--runs N] [--plot FILE.png] [--json] [--workers N | --scheduler ADDR]
    polygrad demo gat | sage [--sampled]      the same flags as gcn
    polygrad demo gin [--data DIR] [--epochs N] [--seed S] [--runs N] [--json] ...   graph classification
    polygrad demo link [--data DIR | --download] [--epochs N] [--runs N] [--json] ...  link prediction
    polygrad check ...                         the backend conformance kit (polygrad.testing)
    polygrad bench                             says where the benchmarks are (python -m benchmarks)

Exit status: 0 on success, 1 when the command ran and failed (a polygrad error: missing dataset,
unavailable backend, ...), 2 for usage errors and missing optional pieces.  Errors are one line
on stderr, never a traceback (``POLYGRAD_DEBUG=1`` shows it).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import shutil
import sys
from typing import Any, Callable, Sequence

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _print_json(record: dict[str, Any]) -> None:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if hasattr(v, "item"):
            return clean(v.item())
        return v
    print(json.dumps(clean(record)), flush=True)


# ----------------------------------------------------------------------------------------------
# backends
# ----------------------------------------------------------------------------------------------

def cmd_backends(args: argparse.Namespace) -> int:
    import polygrad as pg

    infos = pg.list_backends()
    rows = [{"name": i.name, "available": i.available, "reason": i.reason or "-", "origin": i.origin}
            for i in infos]
    failures = _probe_event_hooks(pg)
    if args.json:
        _print_json({"backends": rows, "hook_failures": failures})
        return EXIT_OK
    cols = ["name", "available", "reason", "origin"]
    cells = [[str(r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    if failures:
        print("event hooks disabled because they raised (the computation went on without them):")
        for where, why in failures.items():
            print(f"  {where}: {why}")
    return EXIT_OK


def _probe_event_hooks(pg: Any) -> dict:
    """Fire the event hooks once with a tiny computation, so a plugin's raising listener is found
    (and disabled) here rather than in the user's program; returns ``pg.stats()["hook_failures"]``."""
    import warnings

    import numpy as np
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            x = pg.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
            (x @ x).sum().backward()
            pg.tensor(np.eye(64), layout="auto")  # a layout decision
        except Exception:  # noqa: BLE001 - a broken backend is already listed in the table
            pass
    return pg.stats()["hook_failures"]


# ----------------------------------------------------------------------------------------------
# demos
# ----------------------------------------------------------------------------------------------

def _summary_moons(r: dict[str, Any]) -> str:
    return (f"moons MLP 2-16-16-1: accuracy {r['accuracy']:.1%} after {r['steps']} steps, loss {r['loss']:.4f}, "
            f"{r['step_time_ms']:.2f} ms/step (median), peak RSS {r['peak_rss_mb']:.0f} MiB, "
            f"backend {r['backend']}")


_MODEL_NAMES = {"gcn": "GCN", "gat": "GAT", "sage": "GraphSAGE", "gin": "GIN"}


def _summary_gcn(r: dict[str, Any]) -> str:
    acc = f"{r['test_accuracy']:.1%}"
    if r["runs"] > 1:
        acc = f"{acc} ± {r['test_accuracy_std']:.1%} (mean over {r['runs']} seeds)"
    model = _MODEL_NAMES.get(r["demo"], r["demo"]) + (" (sampled mini-batches)" if r.get("sampled") else "")
    if r["demo"] == "gin":
        return (f"GIN on {r['dataset']} ({r['num_test_graphs']} test graphs, chance {r['chance_accuracy']:.0%}): "
                f"test accuracy {acc} "
                f"after {r['epochs']} epochs, {r['epoch_time_ms']:.2f} ms/epoch (median), peak RSS "
                f"{r['peak_rss_mb']:.0f} MiB, backend {r['backend']}")
    return (f"{model} on {r['dataset']} ({r['num_nodes']} nodes): test accuracy {acc} after {r['epochs']} epochs, "
            f"{r['epoch_time_ms']:.2f} ms/epoch (median), peak RSS {r['peak_rss_mb']:.0f} MiB, "
            f"backend {r['backend']}")


def _summary_link(r: dict[str, Any]) -> str:
    auc = f"{r['test_auc']:.4f}"
    if r["runs"] > 1:
        auc = f"{auc} ± {r['test_auc_std']:.4f} (mean over {r['runs']} seeds)"
    return (f"link prediction (GCN encoder, dot-product decoder) on {r['dataset']} ({r['num_nodes']} nodes): "
            f"test AUC {auc} after {r['epochs']} epochs, {r['epoch_time_ms']:.2f} ms/epoch (median), "
            f"peak RSS {r['peak_rss_mb']:.0f} MiB, backend {r['backend']}")


def _check_backend(name: str | None) -> None:
    if name is not None:
        import polygrad as pg
        with pg.use_backend(name):  # raises BackendUnavailableError with the reason, before any work
            pass


def _check_output_folders(args: argparse.Namespace) -> None:
    """Refuse, before any training, a --plot/--graph file whose folder does not exist (an error
    after a long run would waste it)."""
    from polygrad.ir.errors import PolygradError

    for flag in ("plot", "graph"):
        path = getattr(args, flag, None)
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise PolygradError(f"--{flag} {path}: the folder {folder} does not exist")


def _check_graph_path(path: str | None) -> None:
    """Refuse, before any training, a ``--graph`` image the machine cannot render."""
    if not path:
        return
    from polygrad.apps.demos import MissingExtraError

    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix in ("gv", "dot"):
        return  # DOT text: no graphviz needed
    if importlib.util.find_spec("graphviz") is None:
        raise MissingExtraError(f"--graph {path} renders an image, which needs the graphviz Python package "
                                "(pip install graphviz, or pip install 'polygrad-core[viz]'); --graph FILE.gv "
                                "writes DOT text without it")
    if shutil.which("dot") is None:
        raise MissingExtraError(f"--graph {path} renders an image, which needs graphviz's `dot` program "
                                "(apt-get install graphviz / brew install graphviz); --graph FILE.gv writes "
                                "DOT text without it")


def _connect_cluster(args: argparse.Namespace) -> Any:
    """--workers N / --scheduler ADDRESS: the backend's cluster (``Backend.connect``), or None."""
    if not (getattr(args, "workers", None) or getattr(args, "scheduler", None)):
        return None
    import polygrad as pg
    from polygrad.runtime.registry import registry
    be = registry.get(args.backend or pg.get_backend())
    return be.connect(scheduler=args.scheduler, workers=args.workers)


def cmd_demo(args: argparse.Namespace) -> int:
    from polygrad.apps import demos

    _check_backend(args.backend)
    _check_output_folders(args)
    _check_graph_path(args.graph)
    progress = not args.no_progress
    if args.demo == "moons":
        result = demos.run_moons(steps=args.steps, n_samples=args.samples, noise=args.noise, seed=args.seed,
                                 backend=args.backend, plot=args.plot, progress=progress,
                                 rollback=args.rollback, monitor=args.monitor, graph=args.graph,
                                 compile=args.compile)
        print(_summary_moons(result), flush=True)
    elif args.demo == "gin":
        from polygrad.apps import gnn_demos
        result = gnn_demos.run_gin(backend=args.backend, epochs=args.epochs, seed=args.seed, runs=args.runs,
                                   plot=args.plot, progress=progress, monitor=args.monitor, graph=args.graph,
                                   **({"data": args.data} if getattr(args, "data", None) else {}))
        print(_summary_gcn(result), flush=True)
    elif args.demo == "link":
        from polygrad.apps import gnn_demos
        if args.plot or args.graph:
            raise ValueError("demo link: --plot and --graph are not supported by this demo (yet)")
        if args.data is None and not args.download:
            print("polygrad: no --data DIR given: link prediction on the embedded synthetic graph (stochastic "
                  "block model); pass --data <folder with ind.cora.*> (or --download) for Cora", file=sys.stderr)
        result = gnn_demos.run_link(data=args.data, dataset=args.dataset, backend=args.backend, epochs=args.epochs,
                                    seed=args.seed, runs=args.runs, progress=progress, download=args.download,
                                    monitor=args.monitor)
        print(_summary_link(result), flush=True)
    else:
        data = args.data
        synthetic = data is None and not args.download
        if synthetic and args.dataset.lower() != "cora":
            print(f"polygrad: note: --dataset {args.dataset} needs --data DIR or --download; running on the "
                  "embedded synthetic graph", file=sys.stderr)
        run: Callable[..., dict[str, Any]]
        if args.demo in ("gat", "sage"):
            from polygrad.apps import gnn_demos
            run = gnn_demos.run_gat if args.demo == "gat" else gnn_demos.run_sage
            extra: dict[str, Any] = {"sampled": args.sampled} if args.demo == "sage" else {}
        else:
            run, extra = demos.run_gcn, {"compile": args.compile}
        cluster = _connect_cluster(args)
        try:
            result = run(data=data, dataset=args.dataset, backend=args.backend, epochs=args.epochs,
                         seed=args.seed, runs=args.runs, plot=args.plot, progress=progress,
                         download=args.download, monitor=args.monitor, graph=args.graph, **extra)
        finally:
            if cluster is not None:
                cluster.close()
        if synthetic:
            print("polygrad: no --data DIR given: trained on the embedded synthetic graph (stochastic block "
                  "model); pass --data <folder with ind.cora.*> (or --download) for Cora", file=sys.stderr)
        print(_summary_gcn(result), flush=True)
    for written in (args.plot, args.graph):
        if written:
            print(f"wrote {written}", flush=True)
    if args.json:
        score = "test_auc" if args.demo == "link" else "test_accuracy"
        keys = ["demo", score, "epochs", "epoch_time_ms", "peak_rss_mb", "backend"]
        extra = {k: v for k, v in result.items() if k not in keys}
        _print_json({**{k: result[k] for k in keys}, **extra})
    return EXIT_OK


# ----------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------

BENCH_MOVED = ("the benchmarks live in the source checkout, not in the installed package: run "
               "`python -m benchmarks --list` (or `python -m benchmarks NAME`) from the checkout's root")


def cmd_bench(args: argparse.Namespace) -> int:
    """``polygrad bench`` says where the benchmarks are.  It imports nothing: running code found in
    the current directory (as it once did) would run whatever a ``benchmarks/`` folder there holds."""
    print(f"polygrad bench: {BENCH_MOVED}", file=sys.stderr)
    return 2


def cmd_check(args: argparse.Namespace) -> int:
    """Hand over to the conformance kit, imported only now (it pulls in pytest machinery)."""
    try:
        conformance = importlib.import_module("polygrad.testing.conformance")
        entry: Callable[..., Any] = conformance.main
    except (ImportError, AttributeError) as exc:
        print(f"polygrad: the conformance kit is not available in this installation "
              f"(polygrad.testing.conformance: {exc}); install the test extra: pip install 'polygrad-core[test]'",
              file=sys.stderr)
        return EXIT_USAGE
    return int(entry(list(args.check_args)) or 0)


# ----------------------------------------------------------------------------------------------
# parser
# ----------------------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_common_demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", metavar="NAME", help="backend to run on (default: $POLYGRAD_BACKEND or numpy)")
    p.add_argument("--plot", metavar="FILE.png", help="save a picture (needs matplotlib: the viz extra)")
    p.add_argument("--json", action="store_true", help="end with one JSON line of results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--monitor", action="store_true",
                   help="print the monitor's report each epoch (nnz ratios, grad norm, memory, fallbacks)")
    p.add_argument("--graph", metavar="FILE.gv",
                   help="draw the first step's autodiff graph (.gv/.dot as text; .svg/.png need graphviz)")


def _add_compile_arg(p: argparse.ArgumentParser) -> None:
    """--compile/--no-compile, for the demos whose training step pg.compile replays (moons, gcn)."""
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="replay captured training steps (pg.compile; same numbers, less overhead); "
                        "--no-compile runs every step eagerly")


def version_report() -> str:
    """polygrad's version, then one line per distribution that provides plugins (entry-point group
    ``polygrad``) with its version and what it provides; failed plugins say so."""
    from importlib.metadata import PackageNotFoundError, version

    import polygrad as pg

    lines = [f"polygrad {pg.__version__}"]
    provided: dict[str, list[str]] = {}
    for info in pg.list_backends():
        note = "" if info.status == "ok" else f" [{info.status}]"
        provided.setdefault(info.origin, []).append(info.name + note)
    for origin in sorted(provided):
        try:
            ver = version(origin) if not origin.startswith("<") else ""
        except PackageNotFoundError:
            ver = "?"
        lines.append(f"  {origin} {ver}".rstrip() + f": {', '.join(provided[origin])}")
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """``--version``, computed only when asked (it loads the plugins to list their versions)."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        print(version_report())
        parser.exit()


def _add_node_demo_args(g: argparse.ArgumentParser) -> None:
    """The flags of the node-classification demos (gcn, gat, sage)."""
    g.add_argument("--data", metavar="DIR", help="folder with the Planetoid files (ind.cora.x, ...)")
    g.add_argument("--dataset", default="cora", help="cora, citeseer or pubmed (default cora)")
    g.add_argument("--download", action="store_true",
                   help="without --data: fetch the dataset into polygrad's cache (needs the network)")
    g.add_argument("--epochs", type=_positive_int, default=200, help="training epochs (default 200)")
    g.add_argument("--seed", type=int, default=0, help="seed of the (first) run (default 0)")
    g.add_argument("--runs", type=_positive_int, default=1, help="runs with seeds seed, seed+1, ...; "
                                                                  "reports the mean test accuracy")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polygrad", description="polygrad: autograd for sparse, irregular data")
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show polygrad's version and each discovered plugin's, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("backends", help="list the discovered backends (name, available, reason, origin)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    p.set_defaults(func=cmd_backends)

    demo = sub.add_parser("demo", help="run a demo (moons, gcn, gat, sage, gin)")
    dsub = demo.add_subparsers(dest="demo", metavar="DEMO")
    dsub.required = True
    m = dsub.add_parser("moons", help="micrograd's moons MLP (2-16-16-1, max-margin, SGD, 100 steps)")
    m.add_argument("--steps", type=_positive_int, default=100, help="training steps (default 100)")
    m.add_argument("--samples", type=_positive_int, default=100, help="number of points (default 100)")
    m.add_argument("--noise", type=float, default=0.1, help="noise of the moons (default 0.1)")
    m.add_argument("--seed", type=int, default=1337, help="data and init seed (default 1337)")
    m.add_argument("--rollback", type=float, metavar="THRESH", default=None,
                   help="roll back when the loss rises more than THRESH (e.g. 0.05); off by default")
    _add_compile_arg(m)
    _add_common_demo_args(m)
    m.set_defaults(func=cmd_demo)
    g = dsub.add_parser("gcn", help="Kipf & Welling's GCN (Cora with --data, else a synthetic graph)")
    _add_node_demo_args(g)
    where = g.add_mutually_exclusive_group()
    where.add_argument("--workers", type=_positive_int, metavar="N",
                       help="a distributed backend (--backend dask): start a local cluster of N worker processes")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="a distributed backend (--backend dask): join the cluster at ADDRESS (tcp://HOST:8786)")
    _add_compile_arg(g)
    _add_common_demo_args(g)
    g.set_defaults(func=cmd_demo)
    for name, text in (("gat", "GAT, PyG's examples/gat.py recipe (Cora with --data, else a synthetic graph)"),
                       ("sage", "GraphSAGE, mean aggregation (Cora with --data, else a synthetic graph)")):
        p = dsub.add_parser(name, help=text)
        _add_node_demo_args(p)  # the GCN demo's flags, same names and defaults
        if name == "sage":
            p.add_argument("--sampled", action="store_true",
                           help="train on neighbour-sampled mini-batches (fan-outs 25, 10; 256 seeds per batch)")
        _add_common_demo_args(p)
        p.set_defaults(func=cmd_demo)
    k = dsub.add_parser("link", help="link prediction, PyG's examples/link_pred.py recipe (Cora with --data, "
                                     "else a synthetic graph)")
    k.add_argument("--data", metavar="DIR", help="folder with the Planetoid files (ind.cora.x, ...)")
    k.add_argument("--dataset", default="cora", help="cora, citeseer or pubmed (default cora)")
    k.add_argument("--download", action="store_true", help="fetch the Planetoid files into polygrad's cache first")
    k.add_argument("--epochs", type=_positive_int, default=100, help="training epochs (default 100)")
    k.add_argument("--seed", type=int, default=0, help="seed of the (first) run (default 0)")
    k.add_argument("--runs", type=_positive_int, default=1, help="runs with seeds seed, seed+1, ... (mean AUC)")
    _add_common_demo_args(k)
    k.set_defaults(func=cmd_demo)
    n = dsub.add_parser("gin", help="GIN graph classification on generated graph families (batching, pooling)")
    n.add_argument("--data", metavar="DIR", help="a TUDataset folder (NAME_A.txt, NAME_graph_indicator.txt, "
                                                 "NAME_graph_labels.txt, ...) to classify instead of generated graphs")
    n.add_argument("--epochs", type=_positive_int, default=50, help="training epochs (default 50)")
    n.add_argument("--seed", type=int, default=0, help="data and init seed of the (first) run (default 0)")
    n.add_argument("--runs", type=_positive_int, default=1, help="runs with seeds seed, seed+1, ...")
    _add_common_demo_args(n)
    n.set_defaults(func=cmd_demo)

    # The conformance kit owns its own options: everything after `check` is passed to it as is.
    b = sub.add_parser("bench", help="where the benchmarks are (python -m benchmarks, in a checkout)",
                       description=f"polygrad bench: {BENCH_MOVED}.")
    b.add_argument("name", nargs="?", help=argparse.SUPPRESS)  # the old usage, answered with where to go
    for flag in ("--list", "--quick", "--json-only"):
        b.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    b.set_defaults(func=cmd_bench)
    c = sub.add_parser("check", help="run the backend conformance kit (polygrad.testing.conformance)",
                       add_help=False)
    c.add_argument("check_args", nargs=argparse.REMAINDER)
    c.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:  # the kit parses its own arguments, --help included
        args = argparse.Namespace(func=cmd_check, check_args=argv[1:])
    else:
        args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    from polygrad.apps.demos import MissingExtraError
    from polygrad.ir.errors import PolygradError

    try:
        return args.func(args)
    except MissingExtraError as exc:
        print(f"polygrad: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (PolygradError, ValueError, OSError) as exc:
        if os.environ.get("POLYGRAD_DEBUG"):
            raise
        print(f"polygrad: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("polygrad: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, RecursionError, ImportError) as exc:  # no traceback for the user
        if os.environ.get("POLYGRAD_DEBUG"):
            raise
        print(f"polygrad: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except Exception as exc:  # noqa: BLE001 - a bug of ours: say so, without a traceback
        if os.environ.get("POLYGRAD_DEBUG"):
            raise
        print(f"polygrad: internal error: {type(exc).__name__}: {exc} (rerun with POLYGRAD_DEBUG=1 for the "
              "traceback, and please report it)", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":  # pragma: no cover - `python -m polygrad.apps.cli` (or `python -m polygrad`)
    raise SystemExit(main())
