"""`python -m crihook` runs the same entry point as the `crihook` console script."""

from crihook.proxy.cli import main

raise SystemExit(main())
