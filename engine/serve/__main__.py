"""``python -m engine.serve [flags]``: see engine.serve.app for the flags and routes."""

import sys

from engine.serve.app import main

sys.exit(main())
