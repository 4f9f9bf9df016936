"""Integrations with web frameworks and database libraries (each imports its library only
when used): :mod:`ackwise.contrib.django`, :mod:`ackwise.contrib.sqlalchemy`."""
