"""`python -m scripts.gpu_acceptance`: see run.py (scripts/gpu-acceptance.sh is the way in)."""

from .run import main

raise SystemExit(main())
