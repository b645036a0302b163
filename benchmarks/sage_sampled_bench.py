"""Benchmark "sage_sampled": neighbour-sampled mini-batch GraphSAGE on a 1M-node graph vs full batch.

The graph: ``random_graph`` with 1,000,000 nodes and 10,000,000 edge_index columns (the size of
the ``scale`` benchmark; ``--quick``: 100,000 / 1,000,000), 64 float32 N(0, 1) features per node
and 4 classes from a planted teacher (built once, saved, loaded by each worker)
``argmax(x R1 + mean_neighbours(x) R2)``, so a GraphSAGE can
learn it from features and neighbourhoods.  10% of the nodes train.

Two runs of the same model (SAGEConv 64 -> 16 -> 4, mean aggregation, ReLU, no dropout, Adam lr
0.01, same init), each in its own process so each peak RSS is its own:

* full batch: one step per epoch on the whole graph, ``full_steps`` steps;
* sampled: ``polygrad.data.NeighborSampler`` (fan-outs 10, 5; 1,024 seeds per batch), one epoch
  over the training nodes (one step per batch).

Reported: per-step training loss of both at matching step counts (the sampled loss is over its
batch's seeds), the sampled model's loss over all training nodes after its epoch (full
neighbourhoods, evaluated after the peak RSS was read), seconds per epoch, and peak RSS of each
process (VmHWM), with the graph/feature arrays' own size as the anchor: the sampled run's
peak minus that baseline is what training costs, independent of the graph's size.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from benchmarks._harness import register  # noqa: E402

FANOUTS = (10, 5)
BATCH = 1024


def _peak_mib() -> float:
    """This process's peak RSS: VmHWM of its own address space (Linux).  ``ru_maxrss`` would
    carry over the parent's size from fork, hiding the worker's own figure."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _problem(nodes: int, edges: int):
    import polygrad as pg
    from polygrad import data as pdata

    ei = pdata.random_graph(nodes, edges, seed=0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(nodes, 64)).astype(np.float32)
    deg = np.maximum(np.bincount(ei[1], minlength=nodes), 1).astype(np.float32)
    adj = pg.from_edge_index(ei[::-1].copy(), nodes, values=(1.0 / deg)[ei[1]])  # rows: destinations
    with pg.no_grad():
        mean_nb = (adj @ pg.tensor(x)).numpy()
    del adj
    r1, r2 = rng.normal(size=(64, 4)), rng.normal(size=(64, 4))
    y = np.argmax(x @ r1 + 2.0 * mean_nb @ r2, axis=1).astype(np.int64)
    train = np.zeros(nodes, dtype=bool)
    train[rng.choice(nodes, nodes // 10, replace=False)] = True
    return ei, x, y, train


def _model():
    import polygrad as pg
    from polygrad import nn, optim

    pg.manual_seed(0)
    model = nn.GraphSAGE(64, 16, 2, 4, dropout=0.0)
    return model, optim.Adam(model.parameters(), lr=0.01)


def worker(mode: str, folder: str, full_steps: int) -> dict:
    import polygrad as pg
    from polygrad import data as pdata
    from polygrad import nn

    ei, x, y, train = (np.load(os.path.join(folder, f"{k}.npy")) for k in ("ei", "x", "y", "train"))
    nodes = x.shape[0]
    baseline = _peak_mib()  # the graph, features and labels in memory: what any training run holds
    model, opt = _model()
    losses = []
    t0 = time.perf_counter()
    if mode == "full":
        xt = pg.tensor(x)
        for _ in range(full_steps):
            loss = nn.cross_entropy(model(xt, ei), y, mask=train)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        seconds = time.perf_counter() - t0
        return {"mode": mode, "losses": losses, "seconds_per_epoch": seconds / full_steps,
                "peak_rss_mib": _peak_mib(), "baseline_rss_mib": baseline, "steps": full_steps}
    sampler = pdata.NeighborSampler(ei, nodes, FANOUTS, batch_size=BATCH, input_nodes=train, seed=0)
    sizes = []
    for sub in sampler:
        logits = model(pg.tensor(x[sub.n_id]), sub.edge_index)
        loss = nn.cross_entropy(logits[np.arange(sub.batch_size)], y[sub.n_id[:sub.batch_size]])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        sizes.append(sub.num_nodes)
    seconds = time.perf_counter() - t0
    peak = _peak_mib()
    with pg.no_grad():  # after the peak was read: the full-graph evaluation is not training memory
        final = float(nn.cross_entropy(model(pg.tensor(x), ei), y, mask=train).item())
    return {"mode": mode, "losses": losses, "seconds_per_epoch": seconds, "peak_rss_mib": peak,
            "baseline_rss_mib": baseline, "steps": len(losses), "final_full_train_loss": final,
            "max_subgraph_nodes": int(max(sizes))}


def _spawn(mode: str, folder: str, full_steps: int) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "benchmarks.sage_sampled_bench", mode, folder, str(full_steps)],
                         cwd=root, capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


@register("sage_sampled", "GraphSAGE on a 1M-node / 10M-edge graph: neighbour-sampled mini-batches vs full "
                          "batch (loss trend, epoch time, peak RSS per process)")
def run(quick: bool) -> dict:
    nodes, edges, full_steps = (100_000, 1_000_000, 30) if quick else (1_000_000, 10_000_000, 30)
    with tempfile.TemporaryDirectory() as folder:  # built once here; each worker only loads it
        for name, array in zip(("ei", "x", "y", "train"), _problem(nodes, edges)):
            np.save(os.path.join(folder, f"{name}.npy"), array)
        full = _spawn("full", folder, full_steps)
        sampled = _spawn("sampled", folder, full_steps)
    rows = []
    for k in sorted({0, 4, 9, 19, full_steps - 1, sampled["steps"] - 1}):
        rows.append({"step": k + 1,
                     "full_batch_loss": full["losses"][k] if k < full["steps"] else "",
                     "sampled_batch_loss": sampled["losses"][k] if k < sampled["steps"] else ""})
    summary = {
        "nodes": nodes, "edges": edges, "fanouts": list(FANOUTS), "batch_size": BATCH,
        "full_steps": full["steps"], "sampled_steps_per_epoch": sampled["steps"],
        "full_loss_first": full["losses"][0], "full_loss_last": full["losses"][-1],
        "sampled_loss_first": sampled["losses"][0],
        "sampled_loss_last10_mean": float(np.mean(sampled["losses"][-10:])),
        "sampled_final_full_train_loss": sampled["final_full_train_loss"],
        "full_seconds_per_epoch": full["seconds_per_epoch"], "sampled_seconds_per_epoch": sampled["seconds_per_epoch"],
        "full_peak_rss_mib": full["peak_rss_mib"], "sampled_peak_rss_mib": sampled["peak_rss_mib"],
        "baseline_rss_mib": sampled["baseline_rss_mib"],
        "sampled_training_rss_mib": sampled["peak_rss_mib"] - sampled["baseline_rss_mib"],
        "full_training_rss_mib": full["peak_rss_mib"] - full["baseline_rss_mib"],
        "max_subgraph_nodes": sampled["max_subgraph_nodes"],
    }
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":  # worker process: MODE FOLDER FULL_STEPS
    print(json.dumps(worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
