"""The example adapter (``examples/adapter``) as an out-of-tree adapter wrote it before
``ackwise.spi`` existed: its SPI names come from ``ackwise`` and ``ackwise.errors``.

Kept as it was, imports included, under the scheme ``dirq-old://`` (the real example has
``dirq://``): ``tests/test_old_names_adapter.py`` proves that such an adapter still works,
both conformance levels, and is warned, naming ``ackwise.spi``.  Do not move its imports to
``ackwise.spi``; that is what it tests.  Registered with ``ACKWISE_PLUGINS=ackwise_dirq_old.plugin``
and this directory on ``PYTHONPATH``, as a distribution's entry point would.
"""
