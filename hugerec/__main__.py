"""`python -m hugerec ...` == `hugerec ...` (torchrun needs a module or a script to launch)."""

from hugerec.cli import main

raise SystemExit(main())
