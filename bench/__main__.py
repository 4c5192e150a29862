"""``python -m bench [all|ceiling|messagex|rabbitmq|idle|backlog|...] [--smoke] ...``, and
``python -m bench soak --minutes N`` (bench/soak.py: a long steady load, not part of ``all``)."""

import sys

if sys.argv[1:2] == ["soak"]:
    from bench.soak import main as soak

    sys.exit(soak(sys.argv[2:]))

from bench.harness import main

sys.exit(main())
