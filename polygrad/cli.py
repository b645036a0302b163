"""The ``polygrad`` command line.

    polygrad backends [--json]                 table of discovered backends
    polygrad demo moons [--plot FILE.png] [--json] ...
    polygrad demo gcn [--data DIR | --download] [--dataset cora] [--backend NAME] [--epochs N]
                      [--seed S] [--runs N] [--plot FILE.png] [--json]
    polygrad check ...                         the backend conformance kit (polygrad.testing)

Exit status: 0 on success, 1 when the command ran and failed (a polygrad error: missing dataset,
unavailable backend, ...), 2 for usage errors and missing optional pieces.  Errors are one line
on stderr, never a traceback (``POLYGRAD_DEBUG=1`` shows it).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
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
    if args.json:
        _print_json({"backends": rows})
        return EXIT_OK
    cols = ["name", "available", "reason", "origin"]
    cells = [[str(r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return EXIT_OK


# ----------------------------------------------------------------------------------------------
# demos
# ----------------------------------------------------------------------------------------------

def _summary_moons(r: dict[str, Any]) -> str:
    return (f"moons MLP 2-16-16-1: accuracy {r['accuracy']:.1%} after {r['steps']} steps, loss {r['loss']:.4f}, "
            f"{r['step_time_ms']:.2f} ms/step (median), peak RSS {r['peak_rss_mb']:.0f} MiB, "
            f"backend {r['backend']}")


def _summary_gcn(r: dict[str, Any]) -> str:
    acc = f"{r['test_accuracy']:.1%}"
    if r["runs"] > 1:
        acc = f"{acc} ± {r['test_accuracy_std']:.1%} (mean over {r['runs']} seeds)"
    return (f"GCN on {r['dataset']} ({r['num_nodes']} nodes): test accuracy {acc} after {r['epochs']} epochs, "
            f"{r['epoch_time_ms']:.2f} ms/epoch (median), peak RSS {r['peak_rss_mb']:.0f} MiB, "
            f"backend {r['backend']}")


def _check_backend(name: str | None) -> None:
    if name is not None:
        import polygrad as pg
        with pg.use_backend(name):  # raises BackendUnavailableError with the reason, before any work
            pass


def cmd_demo(args: argparse.Namespace) -> int:
    from polygrad import demos

    _check_backend(args.backend)
    progress = not args.no_progress
    if args.demo == "moons":
        result = demos.run_moons(steps=args.steps, n_samples=args.samples, noise=args.noise, seed=args.seed,
                                 backend=args.backend, plot=args.plot, progress=progress,
                                 rollback=args.rollback, monitor=args.monitor, graph=args.graph)
        print(_summary_moons(result), flush=True)
    else:
        data = args.data
        synthetic = data is None and not args.download
        if synthetic and args.dataset.lower() != "cora":
            print(f"polygrad: note: --dataset {args.dataset} needs --data DIR or --download; running on the "
                  "embedded synthetic graph", file=sys.stderr)
        result = demos.run_gcn(data=data, dataset=args.dataset, backend=args.backend, epochs=args.epochs,
                               seed=args.seed, runs=args.runs, plot=args.plot, progress=progress,
                               download=args.download, monitor=args.monitor, graph=args.graph)
        if synthetic:
            print("polygrad: no --data DIR given: trained on the embedded synthetic graph (stochastic block "
                  "model); pass --data <folder with ind.cora.*> (or --download) for Cora", file=sys.stderr)
        print(_summary_gcn(result), flush=True)
    for written in (args.plot, args.graph):
        if written:
            print(f"wrote {written}", flush=True)
    if args.json:
        keys = ["demo", "test_accuracy", "epochs", "epoch_time_ms", "peak_rss_mb", "backend"]
        extra = {k: v for k, v in result.items() if k not in keys}
        _print_json({**{k: result[k] for k in keys}, **extra})
    return EXIT_OK


# ----------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------

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


def build_parser() -> argparse.ArgumentParser:
    import polygrad

    parser = argparse.ArgumentParser(prog="polygrad", description="polygrad: autograd for sparse, irregular data")
    parser.add_argument("--version", action="version", version=f"polygrad {polygrad.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("backends", help="list the discovered backends (name, available, reason, origin)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    p.set_defaults(func=cmd_backends)

    demo = sub.add_parser("demo", help="run a demo (moons, gcn)")
    dsub = demo.add_subparsers(dest="demo", metavar="DEMO")
    dsub.required = True
    m = dsub.add_parser("moons", help="micrograd's moons MLP (2-16-16-1, max-margin, SGD, 100 steps)")
    m.add_argument("--steps", type=_positive_int, default=100, help="training steps (default 100)")
    m.add_argument("--samples", type=_positive_int, default=100, help="number of points (default 100)")
    m.add_argument("--noise", type=float, default=0.1, help="noise of the moons (default 0.1)")
    m.add_argument("--seed", type=int, default=1337, help="data and init seed (default 1337)")
    m.add_argument("--rollback", type=float, metavar="THRESH", default=None,
                   help="roll back when the loss rises more than THRESH (e.g. 0.05); off by default")
    _add_common_demo_args(m)
    m.set_defaults(func=cmd_demo)
    g = dsub.add_parser("gcn", help="Kipf & Welling's GCN (Cora with --data, else a synthetic graph)")
    g.add_argument("--data", metavar="DIR", help="folder with the Planetoid files (ind.cora.x, ...)")
    g.add_argument("--dataset", default="cora", help="cora, citeseer or pubmed (default cora)")
    g.add_argument("--download", action="store_true",
                   help="without --data: fetch the dataset into polygrad's cache (needs the network)")
    g.add_argument("--epochs", type=_positive_int, default=200, help="training epochs (default 200)")
    g.add_argument("--seed", type=int, default=0, help="seed of the (first) run (default 0)")
    g.add_argument("--runs", type=_positive_int, default=1, help="runs with seeds seed, seed+1, ...; "
                                                                  "reports the mean test accuracy")
    _add_common_demo_args(g)
    g.set_defaults(func=cmd_demo)

    # The conformance kit owns its own options: everything after `check` is passed to it as is.
    c = sub.add_parser("check", help="run the backend conformance kit (polygrad.testing.conformance)",
                       add_help=False)
    c.add_argument("check_args", nargs=argparse.REMAINDER)
    c.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    from polygrad.demos import MissingExtraError
    from polygrad.errors import PolygradError

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


if __name__ == "__main__":  # pragma: no cover - `python -m polygrad.cli`
    raise SystemExit(main())
