"""``python -m broker_client ...`` is the ``broker`` console script."""

import sys

from broker_client.cli import main

sys.exit(main())
