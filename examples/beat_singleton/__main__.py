import sys

from examples.beat_singleton.runner import main

sys.exit(main())
