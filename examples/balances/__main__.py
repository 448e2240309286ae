import sys

from examples.balances.runner import main

sys.exit(main())
