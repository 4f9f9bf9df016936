"""What every part agrees on: the settlement function, the envelope, the adapter SPI's values (docs/architecture.md)."""
