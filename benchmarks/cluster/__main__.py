"""`python -m benchmarks.cluster`: see the package's docstring."""

from benchmarks.cluster._main import main

raise SystemExit(main())
