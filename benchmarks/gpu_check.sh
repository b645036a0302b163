#!/usr/bin/env bash
# The GPU check of the CuPy backend: ONE command, downloads nothing, finishes within 5 minutes.
#
#     bash benchmarks/gpu_check.sh
#
# What it does, in order (each step has its own time limit; the whole run stops at
# GPU_CHECK_BUDGET_S, default 285 s, so the most important steps come first):
#   1. pip install --no-deps --no-build-isolation -e .   (the machine reaches no package registry;
#      numpy, pluggy, psutil, pytest, setuptools, cupy and torch-geometric must already be there)
#   2. environment report: GPU, versions, pg.list_backends(), the cupy backend's info()
#   3. the cupy tests: tests/backends/test_cupy.py and tests/unit/test_interop.py
#   4. python -m benchmarks gpu: SpMM throughput (1M nodes, 10M edges, F=64) as a fraction of HBM
#      bandwidth, and the Cora GCN epoch time on cupy vs PyTorch Geometric (benchmarks/gpu_bench.py)
#   5. polygrad check cupy            (the conformance kit on the cupy backend)
#   6. python -m benchmarks gcn / sparse on cupy (POLYGRAD_BACKEND=cupy, plus --backend cupy when
#      the harness has that flag), --quick
#   7. the rest of tests/backends restricted to the cupy parametrisation (-k cupy)
#   8. CPU scaling (the device machine has 16 cores; issue 21), run whether or not cupy is usable,
#      on GPU_CHECK_CPU_RESERVE_S seconds (default 100) that the steps above cannot use up:
#      a. python -m benchmarks threads --threads 1,2,4,8,16: each parallel kernel's wall time, CPU
#         time, serial part and bits at each count (a microbenchmark: seconds);
#      b. the scaling table: python -m benchmarks scale --threads 1,2,4,8,16 on an R-MAT graph,
#         polygrad vs torch.sparse CSR (and PyG when installed), with the Amdahl projection.
#      Both sized by GPU_CHECK_SCALE_NODES / GPU_CHECK_SCALE_EDGES (default 200,000 / 2,000,000 so
#      that they fit; the Done-when size is 1,000,000 / 10,000,000)
#
# Data: Cora is read from $POLYGRAD_PLANETOID_DIR, else from .device_data/planetoid in this
# checkout (git-ignored: copy ../shared/data/planetoid there and name .device_data in the run's
# `carry`).  Without it the GCN parts skip with a message.
#
# Output goes to $OUT/gpu_check.log when $OUT is set, else ./gpu_check.log (and to stdout).
# Without a usable GPU every cupy part is skipped with the reason and the script exits 0 when the
# CPU parts pass; with a GPU it exits 1 if any step failed or timed out.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$(pwd)

LOG="${OUT:+$OUT/}gpu_check.log"
BUDGET=${GPU_CHECK_BUDGET_S:-285}
START=$(date +%s)
PY=${PYTHON:-python}
SUMMARY=()
FAILED=0

# seconds kept for the CPU scaling steps at the end (set to 0 when they start)
RESERVE=${GPU_CHECK_CPU_RESERVE_S:-100}
remaining() { echo $(( BUDGET - RESERVE - ($(date +%s) - START) )); }

# step NAME MAX_SECONDS CMD... : run CMD under a time limit, record PASS / FAIL / SKIP
step() {
    local name=$1 max=$2; shift 2
    local left lim t0 rc dt
    left=$(remaining)
    lim=$(( max < left ? max : left ))
    if (( lim < 5 )); then
        SUMMARY+=("SKIP  $name: out of time (budget ${BUDGET}s)"); echo; echo "=== $name: SKIPPED (out of time) ==="
        return
    fi
    local cmd="$*"
    echo; echo "=== $name (limit ${lim}s) ==="; echo "+ ${cmd:0:160}$( (( ${#cmd} > 160 )) && echo ' ...')"
    t0=$(date +%s)
    timeout --kill-after=5 "$lim" "$@"; rc=$?
    dt=$(( $(date +%s) - t0 ))
    if (( rc == 0 )); then
        SUMMARY+=("PASS  $name (${dt}s)")
    elif (( rc == 124 || rc == 137 )); then
        SUMMARY+=("FAIL  $name: timed out after ${lim}s"); FAILED=1
    else
        SUMMARY+=("FAIL  $name (exit $rc, ${dt}s)"); FAILED=1
    fi
}

skip() { SUMMARY+=("SKIP  $1: $2"); echo; echo "=== $1: SKIPPED: $2 ==="; }

# pytest exits 5 when the selection is empty: that is "nothing of this kind yet", not a failure
# (a command, not a function, so that `timeout` can run it)
ALLOW_EMPTY=(bash -c '"$@"; rc=$?; if [ "$rc" = 5 ]; then echo "(no tests selected)"; exit 0; fi; exit "$rc"' allow-empty)

# Is the importable polygrad this checkout, with its entry points?  (asked from another folder,
# so that the checkout itself is not on sys.path)
checkout_importable() {
    (cd / && "$PY" -c '
import sys, importlib.metadata as md, polygrad, polygrad.backends.cupy
names = {e.name for e in md.entry_points(group="polygrad")}
sys.exit(0 if polygrad.__file__.startswith(sys.argv[1]) and {"numpy", "cupy"} <= names else 1)
' "$REPO/polygrad")
}

# Fallback when pip cannot build (setuptools < 70.1 without the `wheel` package fails with
# "invalid command 'bdist_wheel'", and nothing can be downloaded): do what an editable install
# does, by hand -- a dist-info holding the entry points, and an import finder mapping
# polygrad.backends to backends/ (pyproject.toml's package-dir), both in a temporary folder put on
# PYTHONPATH (the finder is loaded by a sitecustomize.py there).
install_by_hand() {
    local site="${TMPDIR:-/tmp}/polygrad-gpu-check-site-$$"
    rm -rf "$site" && mkdir -p "$site" || return 1
    "$PY" - "$site" "$REPO" <<'PYEOF' || return 1
import pathlib, re, sys
site, repo = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
text = (repo / "pyproject.toml").read_text()
try:
    import tomllib
    proj = tomllib.loads(text)["project"]
except ModuleNotFoundError:  # Python 3.10: read just the tables needed here
    proj, table = {"entry-points": {}, "scripts": {}}, None
    for line in text.splitlines():
        if line.startswith("["):
            table = line.strip("[] ")
        elif (m := re.match(r'\s*"?([\w.-]+)"?\s*=\s*"([^"]*)"', line)):
            if table == "project" and m[1] == "version":
                proj["version"] = m[2]
            elif table == "project.scripts":
                proj["scripts"][m[1]] = m[2]
            elif table and table.startswith("project.entry-points."):
                proj["entry-points"].setdefault(table.split(".", 2)[2], {})[m[1]] = m[2]
info = site / f"polygrad-{proj['version']}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: polygrad\nVersion: {proj['version']}\n")
lines = []
for group, items in {**proj.get("entry-points", {}), "console_scripts": proj.get("scripts", {})}.items():
    lines += [f"[{group}]", *(f"{k} = {v}" for k, v in items.items()), ""]
(info / "entry_points.txt").write_text("\n".join(lines))
# longest package first: polygrad.backends lives in backends/, the rest of polygrad in polygrad/
mapping = {"polygrad.backends": str(repo / "backends"), "polygrad": str(repo / "polygrad")}
(site / "sitecustomize.py").write_text(f'''# written by benchmarks/gpu_check.sh (install by hand)
import importlib.util, os, sys
_MAP = {mapping!r}
class _PolygradFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        for pkg, root in _MAP.items():
            if fullname == pkg or fullname.startswith(pkg + "."):
                base = os.path.join(root, *fullname[len(pkg):].split(".")[1:])
                init = os.path.join(base, "__init__.py")
                if os.path.exists(init):
                    return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[base])
                if os.path.exists(base + ".py"):
                    return importlib.util.spec_from_file_location(fullname, base + ".py")
                return None
        return None
sys.meta_path.append(_PolygradFinder)
''')
PYEOF
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "installed by hand: PYTHONPATH=$PYTHONPATH"
}

install() {
    local name="install (pip --no-deps --no-build-isolation -e .)"
    echo; echo "=== $name ==="
    if [[ "${GPU_CHECK_FORCE_BY_HAND:-0}" != 1 ]] \
            && timeout 120 "$PY" -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . \
            && checkout_importable; then
        SUMMARY+=("PASS  $name")
    elif [[ "${GPU_CHECK_FORCE_BY_HAND:-0}" != 1 ]] && checkout_importable; then
        SUMMARY+=("WARN  $name failed; this checkout was already installed (editable): using that")
    elif install_by_hand && checkout_importable; then
        SUMMARY+=("WARN  $name failed; installed by hand (dist-info + import finder on PYTHONPATH)")
    else
        SUMMARY+=("FAIL  $name, and installing by hand failed too"); FAILED=1
    fi
}

main() {
    echo "polygrad GPU check -- $(date -u +%Y-%m-%dT%H:%M:%SZ) -- $(pwd) -- budget ${BUDGET}s -- log $LOG"

    if [[ -n "${POLYGRAD_PLANETOID_DIR:-}" ]]; then
        [[ -f "$POLYGRAD_PLANETOID_DIR/ind.cora.graph" ]] || echo "WARNING: POLYGRAD_PLANETOID_DIR=$POLYGRAD_PLANETOID_DIR has no ind.cora.graph"
    elif [[ -f .device_data/planetoid/ind.cora.graph ]]; then
        export POLYGRAD_PLANETOID_DIR="$PWD/.device_data/planetoid"
    elif [[ -f ../shared/data/planetoid/ind.cora.graph ]]; then
        export POLYGRAD_PLANETOID_DIR="$(cd ../shared/data/planetoid && pwd)"
    else
        echo "NOTE: Cora not found (set POLYGRAD_PLANETOID_DIR or copy it to .device_data/planetoid): GCN parts will skip"
    fi
    echo "POLYGRAD_PLANETOID_DIR=${POLYGRAD_PLANETOID_DIR:-<unset>}"
    unset POLYGRAD_BACKEND

    if [[ "${GPU_CHECK_SKIP_INSTALL:-0}" == 1 ]]; then
        skip "install" "GPU_CHECK_SKIP_INSTALL=1"
    else
        install
    fi

    step "environment" 30 bash -c '
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        '"$PY"' - <<EOF
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for mod in ("numpy", "pluggy", "psutil", "pytest", "cupy", "torch", "torch_geometric", "scipy"):
    try:
        print(f"{mod:16s}", getattr(importlib.import_module(mod), "__version__", "?"))
    except Exception as exc:
        print(f"{mod:16s} not importable ({type(exc).__name__}: {exc})")
import polygrad as pg
for b in pg.list_backends():
    print("backend", b)
from polygrad.runtime.registry import registry
be = registry.entries.get("cupy")
if be is not None and be.backend is not None:
    print("cupy backend info:", be.backend.info())
EOF'

    local reason
    reason=$("$PY" -c '
import polygrad as pg
info = {b.name: b for b in pg.list_backends()}.get("cupy")
print("" if info is not None and info.available else (info.reason if info else "the cupy backend is not registered"))
' 2>&1 | tail -n 1)

    local tests=(tests/backends/test_cupy.py tests/unit/test_interop.py)
    if [[ -n "$reason" ]]; then
        echo; echo "*** cupy backend unavailable: $reason"
        echo "*** the cupy parts below are skipped; the CPU parts (fake-cupy tests, skip messages) still run"
        if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
            # a GPU is there and cupy cannot use it: that is a failure of this check, not a skip
            SUMMARY+=("FAIL  nvidia-smi sees a GPU but the cupy backend is unavailable: $reason"); FAILED=1
        fi
        step "cupy tests (CPU: fake cupy; real cupy skipped)" 120 \
            "$PY" -m pytest "${tests[@]}" -q -rs -p no:cacheprovider
        step "python -m benchmarks gpu (prints its skip reasons)" 60 "$PY" -m benchmarks gpu --quick
        skip "polygrad check cupy" "cupy backend unavailable: $reason"
        skip "benchmarks gcn/sparse on cupy" "cupy backend unavailable: $reason"
        skip "tests/backends -k cupy" "cupy backend unavailable: $reason"
    else
        step "cupy tests" 120 "$PY" -m pytest "${tests[@]}" -q -rs -p no:cacheprovider
        step "python -m benchmarks gpu (SpMM throughput, GCN vs PyG)" 150 "$PY" -m benchmarks gpu
        if command -v polygrad >/dev/null; then
            step "polygrad check cupy" 60 polygrad check cupy
        else
            step "polygrad check cupy (python -m polygrad)" 60 "$PY" -m polygrad check cupy
        fi
        local listed flag=()
        listed=$("$PY" -m benchmarks --list 2>&1)
        if "$PY" -m benchmarks --help 2>&1 | grep -q -- "--backend"; then flag=(--backend cupy); fi
        for name in gcn sparse; do
            if grep -q "^$name " <<<"$listed"; then
                step "benchmarks $name on cupy" 60 env POLYGRAD_BACKEND=cupy "$PY" -m benchmarks "$name" --quick "${flag[@]}"
            else
                skip "benchmarks $name on cupy" "no benchmark named '$name' is registered (python -m benchmarks --list)"
            fi
        done
        step "tests/backends -k cupy (the other backend-parametrised suites)" 60 \
            "${ALLOW_EMPTY[@]}" "$PY" -m pytest tests/backends --ignore=tests/backends/test_cupy.py -q -rs \
            -p no:cacheprovider -k cupy
    fi

    # the CPU scaling steps: the reserved time is theirs now
    RESERVE=0
    local counts="1,2,4,8,16" nproc_here
    nproc_here=$(nproc 2>/dev/null || echo 1)
    if (( nproc_here < 16 )); then counts=$("$PY" -c "import sys; n=int(sys.argv[1]); print(','.join(str(c) for c in (1,2,4,8,16) if c <= n))" "$nproc_here"); fi
    local scale_systems="polygrad,torch-csr"
    if "$PY" -c "import torch_geometric" >/dev/null 2>&1; then scale_systems="$scale_systems,pyg"; fi
    step "parallel kernels (benchmarks threads --threads $counts)" 60 "$PY" -m benchmarks threads \
        --threads "$counts" --graph rmat --repeat 3 \
        --nodes "${GPU_CHECK_SCALE_NODES:-200000}" --edges "${GPU_CHECK_SCALE_EDGES:-2000000}"
    # the scaling table: one process per system and thread count (benchmarks/scale_bench.py)
    step "CPU scaling table (scale --threads $counts --graph rmat)" 240 "$PY" -m benchmarks scale \
        --threads "$counts" --graph rmat --systems "$scale_systems" --epochs 3 \
        --nodes "${GPU_CHECK_SCALE_NODES:-200000}" --edges "${GPU_CHECK_SCALE_EDGES:-2000000}"

    echo; echo "=== summary ($(( $(date +%s) - START ))s of ${BUDGET}s) ==="
    printf '%s\n' "${SUMMARY[@]}"
    if (( FAILED )); then echo "GPU CHECK: FAILED"; else echo "GPU CHECK: OK${reason:+ (cupy parts skipped: $reason)}"; fi
    return $FAILED
}

main "$@" 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
