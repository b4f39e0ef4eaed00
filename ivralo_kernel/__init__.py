"""ivralo-kernel: a guarded Python Jupyter kernel and the host side that keeps it in bounds.

Two processes import this package (the host and the kernel), so this root holds only the
version and imports no room.
"""

__version__ = "0.1.0"
