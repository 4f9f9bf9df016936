"""ackwise-dirq: an example adapter, a broker that is a directory of files (``dirq:///path``).

Written for adapter authors to read (docs/adapter-authors.md): it imports only ackwise's
public names for adapters (``ackwise.spi``, ``ackwise.errors``) and passes both levels of the
conformance suite.  The adapter is :class:`ackwise_dirq.adapter.DirQueueAdapter`;
:mod:`ackwise_dirq.plugin` registers it.
"""
