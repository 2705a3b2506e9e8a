"""Command-line tools (``kaun-ir``), imported as ``kaun_ir.tools``."""
