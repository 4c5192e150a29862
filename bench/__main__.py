"""``python -m bench [all|ceiling|messagex|rabbitmq|idle|backlog] [--smoke] ...``."""

import sys

from bench.harness import main

sys.exit(main())
