"""The gates: one module per gate, the `Gate` protocol and its registry."""
