"""``python -m latentq.report RESULTS.h5 --out DIR [--quantizers SPEC ...]`` (what `latentq report` runs)."""

import sys

from latentq.report.figures import main

sys.exit(main())
