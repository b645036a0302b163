"""``python -m benchmarks NAME [--quick] [--json-only]`` / ``python -m benchmarks --list``."""
from benchmarks._harness import main

raise SystemExit(main())
