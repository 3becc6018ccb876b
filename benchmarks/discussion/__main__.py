"""`python -m benchmarks.discussion`: see the package's docstring."""

from benchmarks.discussion._main import main

raise SystemExit(main())
