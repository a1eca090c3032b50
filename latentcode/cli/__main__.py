"""`python -m latentcode.cli ...`, and so `accelerate launch -m latentcode.cli train ...` and
`torchrun --nproc_per_node N -m latentcode.cli train ...`."""

import sys

from latentcode.cli import main

sys.exit(main())
