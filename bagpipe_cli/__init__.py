"""bagpipe-cli: benchmark and profile Bagpipe-style lookahead embedding caching."""

__version__ = "0.1.0"
