"""Side-by-side benchmarks: MessageX end to end, the raw-SQL ceiling and RabbitMQ.

``python -m bench all`` (or one of ``ceiling``, ``messagex``, ``rabbitmq``, ``idle``,
``backlog``) starts a broker of its own, runs every scenario with the same 1 KiB messages
and counts, prints a table and writes JSON. See bench/README.md.
"""
