import sys

from examples.postgres_only.runner import main

sys.exit(main())
