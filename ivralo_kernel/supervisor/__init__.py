"""[supervisor] The small process between the launcher and the kernel (stdlib only).

It keeps the kernel's whole process tree inside its own lifetime: as a child subreaper it adopts
every orphan the kernel's children leave (``setsid`` daemons, double forks), and when it stops, for
whatever reason, it freezes and kills all of them. See ``supervisor.main`` for the order of steps.
"""

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from ivralo_kernel.supervisor.run import main as _main

    return _main(argv)
